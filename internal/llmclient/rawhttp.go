package llmclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"time"
)

// rawPool is a minimal HTTP/1.1 client for plain-http targets: the calling
// goroutine writes the request and reads the response on a pooled keep-alive
// connection itself. net/http's transport hands every request to a writer
// goroutine and every response back from a reader goroutine; on a busy
// machine each hand-off is a scheduling delay that lands in the measured
// TTFT. This path has none, which lowers the generator's floor.
type rawPool struct {
	maxIdle int
	dialer  net.Dialer

	mu   sync.Mutex
	idle map[string][]*rawConn
}

type rawConn struct {
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	reused bool
}

func newRawPool(maxIdle int) *rawPool {
	if maxIdle <= 0 {
		maxIdle = 4096
	}
	return &rawPool{maxIdle: maxIdle, dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}, idle: map[string][]*rawConn{}}
}

func (p *rawPool) get(ctx context.Context, addr string) (*rawConn, error) {
	p.mu.Lock()
	if l := p.idle[addr]; len(l) > 0 {
		c := l[len(l)-1]
		p.idle[addr] = l[:len(l)-1]
		p.mu.Unlock()
		c.reused = true
		return c, nil
	}
	p.mu.Unlock()
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &rawConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10)}, nil
}

func (p *rawPool) put(addr string, c *rawConn) {
	c.nc.SetDeadline(time.Time{})
	p.mu.Lock()
	if len(p.idle[addr]) < p.maxIdle {
		p.idle[addr] = append(p.idle[addr], c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.nc.Close()
}

// CloseIdle closes every idle connection.
func (p *rawPool) CloseIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = map[string][]*rawConn{}
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.nc.Close()
		}
	}
}

// rawBody is a response body on a pooled connection: read to EOF, then
// closed, it returns the connection to the pool.
type rawBody struct {
	io.Reader
	pool      *rawPool
	addr      string
	c         *rawConn
	eof, keep bool
	stop      func() bool
}

func (b *rawBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *rawBody) Close() error {
	if b.c == nil {
		return nil
	}
	// Reuse only a connection whose response was read whole and whose
	// context did not fire (a fired context poisoned its deadline).
	if b.stop() && b.eof && b.keep {
		b.pool.put(b.addr, b.c)
	} else {
		b.c.nc.Close()
	}
	b.c = nil
	return nil
}

// do sends a POST of body to req's URL and returns the response, whose body
// must be closed. The request's context bounds the whole exchange. Of an
// httptrace.ClientTrace in the context it calls GotFirstResponseByte, once
// the response head is read (as net/http's path does, a little earlier), so
// a caller can tell a request the server has answered from one still
// waiting.
func (p *rawPool) do(req *http.Request, body []byte) (*http.Response, error) {
	ctx := req.Context()
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	var head bytes.Buffer
	head.WriteString("POST ")
	head.WriteString(req.URL.RequestURI())
	head.WriteString(" HTTP/1.1\r\nHost: ")
	head.WriteString(req.URL.Host)
	head.WriteString("\r\nContent-Length: ")
	head.WriteString(strconv.Itoa(len(body)))
	head.WriteString("\r\n")
	if err := req.Header.Write(&head); err != nil {
		return nil, err
	}
	head.WriteString("\r\n")
	for attempt := 0; ; attempt++ {
		c, err := p.get(ctx, addr)
		if err != nil {
			return nil, err
		}
		stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
		resp, err := c.exchange(req, head.Bytes(), body)
		if err != nil {
			stop()
			c.nc.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// A kept-alive connection the server had closed fails before
			// any response byte; the request never reached the server, so
			// send it again on a new connection.
			if c.reused && attempt == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)) {
				continue
			}
			return nil, err
		}
		resp.Body = &rawBody{Reader: resp.Body, pool: p, addr: addr, c: c, keep: !resp.Close, stop: stop}
		if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.GotFirstResponseByte != nil {
			tr.GotFirstResponseByte()
		}
		return resp, nil
	}
}

func (c *rawConn) exchange(req *http.Request, head, body []byte) (*http.Response, error) {
	c.bw.Write(head)
	c.bw.Write(body)
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	return http.ReadResponse(c.br, req)
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
