package extproc

import (
	"encoding/json"
	"strconv"
)

// apiError is an answer in OpenAI's error format, sent as an ImmediateResponse.
type apiError struct {
	status     int
	typ        string // OpenAI error type
	code       string
	param      string
	message    string
	retryAfter int // seconds; 0 = no Retry-After
	reason     string
}

// body renders {"error":{"message":...,"type":...,"param":...,"code":...}}.
func (e *apiError) body() []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	in := inner{Message: e.message, Type: e.typ}
	if e.param != "" {
		in.Param = &e.param
	}
	if e.code != "" {
		in.Code = &e.code
	}
	b, _ := json.Marshal(struct {
		Error inner `json:"error"`
	}{in})
	return b
}

func (e *apiError) statusText() string { return strconv.Itoa(e.status) }

func badRequest(reason, param, msg string) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", code: reason, param: param, message: msg, reason: reason}
}
