package llmclient

// Stream reads an SSE body into res, for the tests of the stream's parsing.
var Stream = (*Client).stream
