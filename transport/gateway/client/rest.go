package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/sse"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// chatREST serves one request over POST /v1/chat/completions, streamed, retrying once on
// peer_lost or unavailable before any token.
func (c *Client) chatREST(ctx context.Context, raw json.RawMessage, onToken func(Token)) (Result, error) {
	body, err := streamBody(raw)
	if err != nil {
		return Result{}, err
	}
	res, n, err := c.restOnce(ctx, body, onToken)
	var e *Error
	if err != nil && n == 0 && errors.As(err, &e) && retryable(e.Code) && ctx.Err() == nil {
		res, _, err = c.restOnce(ctx, body, onToken)
		res.Resubmits = 1
	}
	return res, err
}

// streamBody returns the request object with "stream" and "stream_options.include_usage"
// on, as the gateway's WebSocket endpoint sets them.
func streamBody(raw json.RawMessage) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, errors.New("request body must be a JSON object")
	}
	obj["stream"] = json.RawMessage(`true`)
	obj["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return json.Marshal(obj)
}

// restOnce sends one streamed request and reads its events; n counts the tokens delivered.
func (c *Client) restOnce(ctx context.Context, body []byte, onToken func(Token)) (res Result, n int, err error) {
	if c.ctx.Err() != nil {
		return Result{}, 0, ErrClosed
	}
	// Close ends the request too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return Result{}, 0, fmt.Errorf("gateway URL %q: %w", c.base, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if c.cfg.device != "" {
		req.Header.Set(gateway.DeviceHeader, c.cfg.device)
	}
	resp, err := c.cfg.hc.Do(req)
	if err != nil {
		return Result{}, 0, fmt.Errorf("reach the gateway: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, 0, httpError(resp)
	}
	res = Result{Transport: TransportREST}
	var text strings.Builder
	sr := sse.NewReader(resp.Body, maxSSELine)
	finished := false
	for {
		data, err := sr.Next()
		if errors.Is(err, io.EOF) { // [DONE]
			if !finished {
				return Result{}, n, fmt.Errorf("%w: stream ended without a finish reason", ErrProtocol)
			}
			res.Text, res.Tokens = text.String(), n
			return res, n, nil
		}
		if errors.Is(err, sse.ErrNoDone) {
			return Result{}, n, fmt.Errorf("%w: stream ended without [DONE]", ErrProtocol)
		}
		if err != nil {
			if c.ctx.Err() != nil {
				return Result{}, n, ErrClosed
			}
			return Result{}, n, fmt.Errorf("stream broke: %w", err)
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage     *inference.Usage `json:"usage"`
			Meshinfer *served          `json:"meshinfer"`
			Error     *errorObject     `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return Result{}, n, fmt.Errorf("%w: bad event: %v", ErrProtocol, err)
		}
		if ev.Error != nil {
			return Result{}, n, &Error{Code: ev.Error.Code, Message: ev.Error.Message}
		}
		for _, ch := range ev.Choices {
			if ch.Delta.Content != "" {
				text.WriteString(ch.Delta.Content)
				onToken(Token{Index: n, Text: ch.Delta.Content})
				n++
			}
			if ch.FinishReason != nil {
				finished, res.FinishReason = true, *ch.FinishReason
			}
		}
		if mi := ev.Meshinfer; mi != nil {
			res.Route, res.Tier, res.Attempts = mi.Route, mi.Tier, mi.Attempts
		}
		if ev.Usage != nil {
			res.Usage = *ev.Usage
		}
	}
}
