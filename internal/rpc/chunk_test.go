package rpc_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// result is what an Assembler handed to done.
type result struct {
	payload []byte
	err     error
	calls   int
}

func randomPayload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// transmit sends payload through a Chunker and an Assembler, passing every
// chunk through tamper (which returns the chunks to deliver instead), and
// returns what the receiver got, and whether the payload travelled inline.
func transmit(t *testing.T, c *rpc.Chunker, a *rpc.Assembler, payload []byte, tamper func([]*weirpb.Chunk) []*weirpb.Chunk) (res *result, inline bool) {
	t.Helper()
	res = &result{}
	var chunks []*weirpb.Chunk
	err := c.Send(payload,
		func(p []byte) error { inline, res.payload, res.calls = true, p, 1; return nil },
		func(h *weirpb.Chunked) error {
			a.Expect(h, func(p []byte, err error) { res.payload, res.err = p, err; res.calls++ })
			return nil
		},
		func(ch *weirpb.Chunk) error { chunks = append(chunks, ch); return nil })
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if tamper != nil {
		chunks = tamper(chunks)
	}
	for _, ch := range chunks {
		if err := a.Add(ch); err != nil {
			t.Fatalf("add chunk %d: %v", ch.Seq, err)
		}
	}
	return res, inline
}

func TestChunkedPayloadsArriveWhole(t *testing.T) {
	const size = 64
	for _, tc := range []struct {
		name   string
		n      int
		inline bool
	}{
		{"empty", 0, true},
		{"one byte", 1, true},
		{"exactly one chunk", size, true},
		{"one byte over a chunk", size + 1, false},
		{"many chunks and a partial one", 37*size + 5, false},
		{"whole chunks", 8 * size, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, a := rpc.NewChunker(size), rpc.NewAssembler(0)
			payload := randomPayload(tc.n, uint64(tc.n))
			var sizes []int
			res, inline := transmit(t, c, a, payload, func(chs []*weirpb.Chunk) []*weirpb.Chunk {
				for _, ch := range chs {
					sizes = append(sizes, len(ch.Data))
				}
				return chs
			})
			if inline != tc.inline {
				t.Fatalf("inline = %v, want %v", inline, tc.inline)
			}
			if res.err != nil || res.calls != 1 {
				t.Fatalf("done called %d times, err %v; want once without error", res.calls, res.err)
			}
			if !bytes.Equal(res.payload, payload) {
				t.Fatalf("payload of %d bytes arrived as %d bytes that differ", len(payload), len(res.payload))
			}
			for i, s := range sizes {
				if s > size || s == 0 {
					t.Fatalf("chunk %d holds %d bytes; chunks hold 1..%d", i, s, size)
				}
			}
		})
	}
}

func TestInterleavedPayloadsArriveWhole(t *testing.T) {
	c, a := rpc.NewChunker(16), rpc.NewAssembler(0)
	p1, p2 := randomPayload(100, 1), randomPayload(170, 2)
	h1, c1 := c.Split(p1)
	h2, c2 := c.Split(p2)
	if h1.Transfer == h2.Transfer {
		t.Fatalf("two payloads share transfer %d", h1.Transfer)
	}
	var got1, got2 []byte
	a.Expect(h1, func(p []byte, err error) {
		if err != nil {
			t.Errorf("payload 1: %v", err)
		}
		got1 = p
	})
	a.Expect(h2, func(p []byte, err error) {
		if err != nil {
			t.Errorf("payload 2: %v", err)
		}
		got2 = p
	})
	for i := range max(len(c1), len(c2)) {
		for _, chs := range [][]*weirpb.Chunk{c2, c1} {
			if i < len(chs) {
				if err := a.Add(chs[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if !bytes.Equal(got1, p1) || !bytes.Equal(got2, p2) {
		t.Fatalf("interleaved payloads arrived altered: %d/%d and %d/%d bytes", len(got1), len(p1), len(got2), len(p2))
	}
}

func TestBrokenChunkedPayloadsFailClearly(t *testing.T) {
	const size = 32
	for _, tc := range []struct {
		name   string
		tamper func([]*weirpb.Chunk) []*weirpb.Chunk
		want   string
	}{
		{"corrupt chunk", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			d := bytes.Clone(chs[2].Data)
			d[5] ^= 0x40
			chs[2] = &weirpb.Chunk{Transfer: chs[2].Transfer, Seq: chs[2].Seq, Data: d}
			return chs
		}, "checksum"},
		{"missing chunk", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			return append(chs[:1:1], chs[2:]...)
		}, "chunk 2 came where chunk 1 was due"},
		{"chunks out of order", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			chs[1], chs[2] = chs[2], chs[1]
			return chs
		}, "chunk 2 came where chunk 1 was due"},
		{"chunk repeated", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			return append(chs[:2:2], chs[1:]...)
		}, "chunk 1 came where chunk 2 was due"},
		{"chunk longer than sent", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			last := len(chs) - 1
			chs[last] = &weirpb.Chunk{Transfer: chs[last].Transfer, Seq: chs[last].Seq, Data: append(bytes.Clone(chs[last].Data), make([]byte, size)...)}
			return chs
		}, "above the 100 announced"},
		{"chunk shorter than sent", func(chs []*weirpb.Chunk) []*weirpb.Chunk {
			chs[0] = &weirpb.Chunk{Transfer: chs[0].Transfer, Seq: 0, Data: chs[0].Data[:10]}
			return chs
		}, "78 bytes in 4 chunks, 100 announced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := transmit(t, rpc.NewChunker(size), rpc.NewAssembler(0), randomPayload(100, 7), tc.tamper)
			if res.calls != 1 {
				t.Fatalf("done called %d times; want once", res.calls)
			}
			if !errors.Is(res.err, rpc.ErrBadTransfer) || !strings.Contains(res.err.Error(), tc.want) {
				t.Fatalf("err = %v; want ErrBadTransfer saying %q", res.err, tc.want)
			}
			if res.payload != nil {
				t.Fatalf("a broken payload was handed over (%d bytes)", len(res.payload))
			}
		})
	}
}

func TestChunkOfNoAnnouncedPayloadIsRefused(t *testing.T) {
	a := rpc.NewAssembler(0)
	if err := a.Add(&weirpb.Chunk{Transfer: 9, Seq: 0, Data: []byte("x")}); !errors.Is(err, rpc.ErrBadTransfer) {
		t.Fatalf("err = %v; want ErrBadTransfer", err)
	}
}

func TestImpossibleOrOversizedHeadersAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  *weirpb.Chunked
		want string
	}{
		{"above the limit", &weirpb.Chunked{Transfer: 1, Size: 1001, Chunks: 2}, "above the limit of 1000"},
		{"no chunks", &weirpb.Chunked{Transfer: 1, Size: 10, Chunks: 0}, "10 bytes in 0 chunks"},
		{"negative size", &weirpb.Chunked{Transfer: 1, Size: -1, Chunks: 1}, "-1 bytes in 1 chunks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got error
			rpc.NewAssembler(1000).Expect(tc.hdr, func(_ []byte, err error) { got = err })
			if !errors.Is(got, rpc.ErrBadTransfer) || !strings.Contains(got.Error(), tc.want) {
				t.Fatalf("err = %v; want ErrBadTransfer saying %q", got, tc.want)
			}
		})
	}
}

func TestAbortEndsIncompletePayloads(t *testing.T) {
	c, a := rpc.NewChunker(8), rpc.NewAssembler(0)
	h, chs := c.Split(randomPayload(30, 3))
	var got error
	a.Expect(h, func(_ []byte, err error) { got = err })
	if err := a.Add(chs[0]); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("session lost")
	a.Abort(cause)
	if !errors.Is(got, rpc.ErrBadTransfer) || !errors.Is(got, cause) {
		t.Fatalf("err = %v; want ErrBadTransfer wrapping the cause", got)
	}
	if err := a.Add(chs[1]); !errors.Is(err, rpc.ErrBadTransfer) {
		t.Fatalf("a chunk after the abort: err = %v; want ErrBadTransfer", err)
	}
}

func TestCheckSizeRefusesMessagesAboveTheLimit(t *testing.T) {
	small := &weirpb.CheckpointAck{Snapshot: make([]byte, rpc.MaxMessageSize-100)}
	if err := rpc.CheckSize(small); err != nil {
		t.Fatalf("a message of %d bytes: %v", proto.Size(small), err)
	}
	big := &weirpb.CheckpointAck{Snapshot: make([]byte, rpc.MaxMessageSize)}
	if err := rpc.CheckSize(big); !errors.Is(err, rpc.ErrMessageTooLarge) {
		t.Fatalf("a message of %d bytes: err = %v; want ErrMessageTooLarge", proto.Size(big), err)
	}
}
