package fleetsim

import (
	"strconv"
	"unicode/utf8"
)

// chatBody appends the request's /v1/chat/completions body (OpenAI JSON:
// model, messages, max_tokens, stream) to b: what the frontend Envoy
// buffers and ext_proc parses.
func chatBody(b []byte, p *request) []byte {
	b = append(b, `{"model":`...)
	b = appendJSONString(b, p.s().sc.Workload.Model)
	b = append(b, `,"messages":[`...)
	for i, m := range p.w.Messages {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = appendJSONString(b, m.Role)
		b = append(b, `,"content":`...)
		b = appendJSONString(b, m.Content)
		b = append(b, '}')
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(max(p.w.MaxTokens, 1)), 10)
	return append(b, `,"stream":true}`...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i += n
				start = i
				continue
			}
			i += n
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
