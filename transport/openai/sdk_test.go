package openai

import (
	"context"
	"errors"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/meshinfer/meshinfer/inference"
)

// The official OpenAI Go SDK as a client of the API.

// sdkClient is an SDK client for s; retries are off so that an error surfaces at once.
func sdkClient(t *testing.T, s *Server) sdk.Client {
	return sdk.NewClient(
		option.WithBaseURL("http://"+s.Addr()+"/v1/"),
		option.WithAPIKey("unused"),
		option.WithHTTPClient(newClient(t)),
		option.WithMaxRetries(0),
	)
}

// sdkRequest is the request the SDK tests send, and its inference.Request twin for the
// reference.
func sdkRequest(model string) (sdk.ChatCompletionNewParams, inference.Request) {
	const system, user = "be brief", "hello from the SDK"
	params := sdk.ChatCompletionNewParams{
		Model:       model,
		Messages:    []sdk.ChatCompletionMessageParamUnion{sdk.SystemMessage(system), sdk.UserMessage(user)},
		MaxTokens:   sdk.Int(20),
		Temperature: sdk.Float(0.7),
		Seed:        sdk.Int(11),
	}
	req := inference.Request{
		Model: model,
		Messages: []inference.Message{
			{Role: inference.RoleSystem, Content: system}, {Role: inference.RoleUser, Content: user},
		},
		MaxTokens: ptr(20), Temperature: ptr(0.7), Seed: ptr[int64](11),
	}
	return params, req
}

func TestSDKChatCompletion(t *testing.T) {
	s := startServer(t, newDispatcher(t))
	client := sdkClient(t, s)
	params, req := sdkRequest(testModel)
	want, wantRes := reference(t, req)

	got, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatalf("Chat.Completions.New: %v", err)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("%d choices, want 1", len(got.Choices))
	}
	if c := got.Choices[0]; c.Message.Content != want || c.FinishReason != string(wantRes.FinishReason) {
		t.Errorf("content %q finish %q\nwant    %q finish %q", c.Message.Content, c.FinishReason, want, wantRes.FinishReason)
	}
	if u := got.Usage; u.PromptTokens != int64(wantRes.Usage.PromptTokens) || u.CompletionTokens != int64(wantRes.Usage.CompletionTokens) ||
		u.TotalTokens != int64(wantRes.Usage.TotalTokens) {
		t.Errorf("usage %+v, want %+v", u, wantRes.Usage)
	}
	if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Model != testModel {
		t.Errorf("id %q model %q", got.ID, got.Model)
	}
	// The meshinfer extension is visible to SDK users as an extra field.
	if f, ok := got.JSON.ExtraFields["meshinfer"]; !ok || !strings.Contains(f.Raw(), `"route":"local"`) {
		t.Errorf("meshinfer extension %q (present %v)", f.Raw(), ok)
	}
}

func TestSDKChatCompletionStreaming(t *testing.T) {
	s := startServer(t, newDispatcher(t))
	client := sdkClient(t, s)
	params, req := sdkRequest(testModel)
	params.StreamOptions = sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)}
	want, wantRes := reference(t, req)

	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	defer stream.Close()
	var (
		acc    sdk.ChatCompletionAccumulator
		text   strings.Builder
		finish string
		chunks int
	)
	for stream.Next() {
		c := stream.Current()
		acc.AddChunk(c)
		chunks++
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != want || finish != string(wantRes.FinishReason) {
		t.Errorf("streamed %q finish %q\nwant     %q finish %q", text.String(), finish, want, wantRes.FinishReason)
	}
	if chunks < 3 {
		t.Errorf("%d chunks: not one per token", chunks)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want || acc.Choices[0].FinishReason != string(wantRes.FinishReason) {
		t.Errorf("accumulated %+v", acc.Choices)
	}
	if acc.Usage.CompletionTokens != int64(wantRes.Usage.CompletionTokens) || acc.Usage.TotalTokens != int64(wantRes.Usage.TotalTokens) {
		t.Errorf("accumulated usage %+v, want %+v", acc.Usage, wantRes.Usage)
	}
}

// TestSDKErrors: a typed error reaches SDK users as *openai.Error with its status and code,
// streaming or not; an error after the first token is a stream error, never a clean end.
func TestSDKErrors(t *testing.T) {
	s := startServer(t, newDispatcher(t))
	client := sdkClient(t, s)
	params, _ := sdkRequest("synth-nope")

	_, err := client.Chat.Completions.New(context.Background(), params)
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("New with an unknown model: %v, want *openai.Error", err)
	}
	if apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" || apiErr.Type != "invalid_request_error" {
		t.Errorf("error status %d code %q type %q, want 404 model_not_found invalid_request_error",
			apiErr.StatusCode, apiErr.Code, apiErr.Type)
	}

	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	for stream.Next() {
		t.Errorf("chunk from a failed request: %+v", stream.Current())
	}
	if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("NewStreaming with an unknown model: %v, want a 404 model_not_found *openai.Error", stream.Err())
	}

	// Mid-stream failure.
	d := newDispatcher(t)
	d.after = func(_ context.Context, tok inference.Token) error {
		if tok.Index == 1 {
			return inference.Errorf(inference.CodePeerLost, "serving peer went away")
		}
		return nil
	}
	s2 := startServer(t, d)
	params, _ = sdkRequest(testModel)
	client2 := sdkClient(t, s2)
	stream = client2.Chat.Completions.NewStreaming(context.Background(), params)
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				t.Errorf("finish reason %q in a failed stream", ch.FinishReason)
			}
		}
	}
	var streamErr *ssestream.StreamError
	if !errors.As(stream.Err(), &streamErr) || !strings.Contains(string(streamErr.Event.Data), `"code":"peer_lost"`) {
		t.Errorf("mid-stream failure: err %v, want a stream error carrying peer_lost", stream.Err())
	}
	if text.Len() == 0 {
		t.Errorf("no text before the error")
	}
}
