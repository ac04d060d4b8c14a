package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// browser is a headless Chromium driven in real time over the DevTools
// protocol on a pipe (--remote-debugging-pipe: JSON messages, each ended by
// a NUL byte, written to its fd 3 and read from its fd 4), attached to one
// page. It answers the page's dialogs with answerDialog and counts them.
type browser struct {
	t       *testing.T
	in      io.WriteCloser
	session string

	mu       sync.Mutex
	next     int
	pending  map[int]chan cdpMessage
	dialogs  []string // the messages of the dialogs the page opened
	requests []cdpRequest
	// answerDialog returns the text a prompt is answered with, and whether
	// the dialog is accepted.
	answerDialog func(kind, message string) (string, bool)
}

type cdpMessage struct {
	ID        int             `json:"id"`
	Method    string          `json:"method"`
	Params    json.RawMessage `json:"params"`
	Result    json.RawMessage `json:"result"`
	Error     *struct{ Message string }
	SessionID string `json:"sessionId"`
}

// cdpRequest is a request the page sent.
type cdpRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"postData"`
}

// startBrowser starts Chromium (skipping the test without one) on an empty
// page and attaches to it; it stops with the test.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	bin := chromium(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--remote-debugging-pipe", "--user-data-dir="+t.TempDir(), "--window-size=1280,1450", "about:blank")
	toChrome, ourIn, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ourOut, fromChrome, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{toChrome, fromChrome} // fds 3 and 4
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toChrome.Close()
	fromChrome.Close()
	b := &browser{t: t, in: ourIn, pending: map[int]chan cdpMessage{},
		answerDialog: func(string, string) (string, bool) { return "", true }}
	read := make(chan struct{})
	go func() {
		defer close(read)
		b.read(ourOut)
	}()
	t.Cleanup(func() {
		ourIn.Close() // Chromium exits when its pipe closes
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
		ourOut.Close()
		<-read
		if t.Failed() {
			t.Logf("chromium stderr:\n%s", stderr.String())
		}
	})
	var target struct{ TargetID string }
	b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct{ SessionID string }
	b.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	b.session = attached.SessionID
	b.call(b.session, "Page.enable", nil, nil)
	b.call(b.session, "Network.enable", nil, nil)
	return b
}

// lockedBuffer is a bytes buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// read dispatches Chromium's messages: answers to calls, and the events
// the test follows (dialogs, requests).
func (b *browser) read(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m cdpMessage
		if err := json.Unmarshal(raw[:len(raw)-1], &m); err != nil {
			continue
		}
		switch {
		case m.ID != 0:
			b.mu.Lock()
			ch := b.pending[m.ID]
			delete(b.pending, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case m.Method == "Page.javascriptDialogOpening":
			var d struct{ Type, Message string }
			_ = json.Unmarshal(m.Params, &d)
			b.mu.Lock()
			b.dialogs = append(b.dialogs, d.Type+": "+d.Message)
			answer := b.answerDialog
			b.mu.Unlock()
			text, accept := answer(d.Type, d.Message)
			// Answered from another goroutine: this one must keep reading.
			go b.send(m.SessionID, "Page.handleJavaScriptDialog", map[string]any{"accept": accept, "promptText": text})
		case m.Method == "Network.requestWillBeSent":
			var ev struct{ Request cdpRequest }
			_ = json.Unmarshal(m.Params, &ev)
			b.mu.Lock()
			b.requests = append(b.requests, ev.Request)
			b.mu.Unlock()
		}
	}
}

// send writes one call and returns the channel its answer comes on.
func (b *browser) send(session, method string, params any) chan cdpMessage {
	b.mu.Lock()
	b.next++
	id := b.next
	ch := make(chan cdpMessage, 1)
	b.pending[id] = ch
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, err := json.Marshal(msg)
	if err == nil {
		_, err = b.in.Write(append(raw, 0))
	}
	b.mu.Unlock()
	if err != nil {
		close(ch)
	}
	return ch
}

// call makes one call and decodes its result into out (unless nil).
func (b *browser) call(session, method string, params, out any) {
	b.t.Helper()
	select {
	case m, ok := <-b.send(session, method, params):
		if !ok {
			b.t.Fatalf("%s: chromium went away", method)
		}
		if m.Error != nil {
			b.t.Fatalf("%s: %s", method, m.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(m.Result, out); err != nil {
				b.t.Fatalf("%s: %v: %s", method, err, m.Result)
			}
		}
	case <-time.After(30 * time.Second):
		b.t.Fatalf("%s: no answer from chromium in 30s", method)
	}
}

// navigate loads url in the page.
func (b *browser) navigate(url string) {
	b.t.Helper()
	b.call(b.session, "Page.navigate", map[string]any{"url": url}, nil)
}

// eval evaluates a JavaScript expression in the page (awaiting a promise)
// and decodes its value into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	b.call(b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if res.ExceptionDetails != nil {
		b.t.Fatalf("evaluating %s: %s %s", expr, res.ExceptionDetails.Text, res.ExceptionDetails.Exception.Description)
	}
	if out != nil && len(res.Result.Value) > 0 {
		if err := json.Unmarshal(res.Result.Value, out); err != nil {
			b.t.Fatalf("evaluating %s: %v: %s", expr, err, res.Result.Value)
		}
	}
}

// waitFor evaluates expr (a boolean) until it is true, for at most d; an
// expression that throws (the page is still loading) is false.
func (b *browser) waitFor(what, expr string, d time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for {
		var ok bool
		b.eval("(() => { try { return !!("+expr+"); } catch (e) { return false; } })()", &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var page string
			b.eval(`document.body ? document.body.innerText : "(no body)"`, &page)
			b.t.Fatalf("%s: not after %v; the page reads:\n%s", what, d, page)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// text is the page's visible text of the element matching selector.
func (b *browser) text(selector string) string {
	b.t.Helper()
	var s string
	b.eval(fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, selector), &s)
	return s
}

// dialogCount is how many dialogs the page opened so far.
func (b *browser) dialogCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.dialogs)
}

// sent returns the requests the page sent with method.
func (b *browser) sent(method string) []cdpRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []cdpRequest
	for _, r := range b.requests {
		if r.Method == method {
			out = append(out, r)
		}
	}
	return out
}

// screenshot saves a PNG of the whole page to path.
func (b *browser) screenshot(path string) {
	b.t.Helper()
	var shot struct {
		Data []byte `json:"data"` // base64 in JSON
	}
	b.call(b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &shot)
	if err := os.WriteFile(path, shot.Data, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("dashboard screenshot saved to %s", path)
}
