package rpc

import (
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// Large payloads on a session (docs/architecture.md, "Cluster"): a bytes
// field larger than the chunk size (a checkpoint ack's snapshot, a
// deployment's restored state) is not sent inside its message. The message
// carries a weirpb.Chunked header instead, and the payload follows in
// weirpb.Chunk messages of at most the chunk size on the same stream. Each
// chunk is a message of its own, so heartbeats and other messages go out
// between them, and no message nears MaxMessageSize. The receiver's
// Assembler collects the chunks into one buffer of the announced size and
// hands the payload over once the last chunk came and the size and
// CRC-32C match. Both directions use this one implementation.

// DefaultChunkSize is the largest payload sent inside its message, and the
// size of each chunk of a larger one.
const DefaultChunkSize = 1 << 20

// MaxMessageSize is the largest message either end of the control plane
// receives (gRPC's default, set explicitly on both ends). Senders check it
// (CheckSize) so that an oversized message fails where it is sent, with its
// real cause, instead of breaking the receiver's stream.
const MaxMessageSize = 4 << 20

// ErrMessageTooLarge is wrapped by CheckSize's error: the message exceeds
// MaxMessageSize. Sending it again cannot succeed.
var ErrMessageTooLarge = errors.New("message larger than the limit")

// ErrBadTransfer is wrapped by the errors of a chunked payload that cannot
// be assembled: a chunk missing or out of order, more data than announced,
// a checksum mismatch, a chunk of no announced payload, or a header that
// cannot be right.
var ErrBadTransfer = errors.New("chunked payload cannot be assembled")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CheckSize returns an error wrapping ErrMessageTooLarge if m's encoding
// is larger than MaxMessageSize.
func CheckSize(m proto.Message) error {
	if n := proto.Size(m); n > MaxMessageSize {
		return fmt.Errorf("%w: %T of %d bytes (limit %d)", ErrMessageTooLarge, m, n, MaxMessageSize)
	}
	return nil
}

// Chunker splits payloads for one sender on one stream. Safe for concurrent
// use.
type Chunker struct {
	size int
	next atomic.Uint64
}

// NewChunker returns a Chunker sending payloads above size bytes in chunks
// of size bytes (size <= 0: DefaultChunkSize).
func NewChunker(size int) *Chunker {
	if size <= 0 {
		size = DefaultChunkSize
	}
	return &Chunker{size: size}
}

// Send sends payload: within the chunk size, sendInline(payload) sends it
// inside its message; above it, sendHeader(hdr) sends the message with the
// payload left out and hdr announcing it, then sendChunk sends each chunk
// in order. The chunks share payload's memory (nothing is copied). It
// returns the first error of a send function.
func (c *Chunker) Send(payload []byte, sendInline func([]byte) error, sendHeader func(*weirpb.Chunked) error,
	sendChunk func(*weirpb.Chunk) error) error {
	hdr, chunks := c.Split(payload)
	if hdr == nil {
		return sendInline(payload)
	}
	if err := sendHeader(hdr); err != nil {
		return err
	}
	for _, ch := range chunks {
		if err := sendChunk(ch); err != nil {
			return err
		}
	}
	return nil
}

// Split returns the header and chunks of payload, or nil, nil when payload
// fits in one chunk (it then travels inside its message).
func (c *Chunker) Split(payload []byte) (*weirpb.Chunked, []*weirpb.Chunk) {
	if len(payload) <= c.size {
		return nil, nil
	}
	n := (len(payload) + c.size - 1) / c.size
	hdr := &weirpb.Chunked{Transfer: c.next.Add(1), Size: int64(len(payload)), Chunks: int32(n),
		Crc32C: crc32.Checksum(payload, castagnoli)}
	chunks := make([]*weirpb.Chunk, n)
	for i := range chunks {
		end := min((i+1)*c.size, len(payload))
		chunks[i] = &weirpb.Chunk{Transfer: hdr.Transfer, Seq: int32(i), Data: payload[i*c.size : end]}
	}
	return hdr, chunks
}

// Assembler reassembles the chunked payloads one stream receives. Safe for
// concurrent use, though a stream's receive loop is its only user.
type Assembler struct {
	max int64

	mu      sync.Mutex
	pending map[uint64]*transfer
}

type transfer struct {
	hdr  *weirpb.Chunked
	buf  []byte
	next int32
	crc  uint32
	done func([]byte, error)
	// failed: done got an error; the rest of the chunks are dropped.
	failed bool
}

// NewAssembler returns an Assembler that refuses payloads announced larger
// than max bytes (max <= 0: no limit but the machine's memory).
func NewAssembler(max int64) *Assembler {
	return &Assembler{max: max, pending: map[uint64]*transfer{}}
}

// Expect registers the payload hdr announces; done is called once, on the
// goroutine that adds its last chunk, with the payload, or with an error
// wrapping ErrBadTransfer (at once for a header that cannot be right).
func (a *Assembler) Expect(hdr *weirpb.Chunked, done func([]byte, error)) {
	bad := func(format string, args ...any) {
		done(nil, fmt.Errorf("%w: transfer %d: %s", ErrBadTransfer, hdr.GetTransfer(), fmt.Sprintf(format, args...)))
	}
	switch {
	case hdr.GetSize() < 0 || hdr.GetChunks() < 1 || int64(hdr.GetChunks()) > hdr.GetSize():
		bad("%d bytes in %d chunks", hdr.GetSize(), hdr.GetChunks())
		return
	case a.max > 0 && hdr.GetSize() > a.max:
		bad("%d bytes announced, above the limit of %d", hdr.GetSize(), a.max)
		return
	}
	a.mu.Lock()
	_, dup := a.pending[hdr.Transfer]
	if !dup {
		a.pending[hdr.Transfer] = &transfer{hdr: hdr, buf: make([]byte, 0, hdr.Size), done: done}
	}
	a.mu.Unlock()
	if dup {
		bad("announced twice")
	}
}

// Add adds one chunk. A chunk that breaks its payload (missing or out of
// order, more data than announced, a checksum mismatch at the end) ends
// that payload: its done gets the error, and its later chunks are dropped.
// A chunk of no announced payload returns an error wrapping ErrBadTransfer.
func (a *Assembler) Add(c *weirpb.Chunk) error {
	a.mu.Lock()
	t, ok := a.pending[c.Transfer]
	if !ok {
		a.mu.Unlock()
		return fmt.Errorf("%w: chunk %d of transfer %d, which was not announced or already ended", ErrBadTransfer, c.Seq, c.Transfer)
	}
	last := c.Seq == t.hdr.Chunks-1
	if t.failed {
		if last {
			delete(a.pending, c.Transfer)
		}
		a.mu.Unlock()
		return nil
	}
	var err error
	switch {
	case c.Seq != t.next:
		err = fmt.Errorf("chunk %d came where chunk %d was due (a chunk is missing or out of order)", c.Seq, t.next)
	case int64(len(t.buf))+int64(len(c.Data)) > t.hdr.Size:
		err = fmt.Errorf("chunk %d brings the payload to %d bytes, above the %d announced", c.Seq, len(t.buf)+len(c.Data), t.hdr.Size)
	}
	if err == nil {
		t.buf = append(t.buf, c.Data...)
		t.crc = crc32.Update(t.crc, castagnoli, c.Data)
		t.next++
		if last {
			switch {
			case int64(len(t.buf)) != t.hdr.Size:
				err = fmt.Errorf("%d bytes in %d chunks, %d announced", len(t.buf), t.hdr.Chunks, t.hdr.Size)
			case t.crc != t.hdr.Crc32C:
				err = fmt.Errorf("checksum %08x, %08x announced (corrupt chunk)", t.crc, t.hdr.Crc32C)
			}
		}
	}
	switch {
	case last:
		delete(a.pending, c.Transfer)
	case err != nil:
		t.failed, t.buf = true, nil // dropped with its last chunk
	}
	a.mu.Unlock()
	switch {
	case err != nil:
		t.done(nil, fmt.Errorf("%w: transfer %d: %w", ErrBadTransfer, c.Transfer, err))
	case last:
		t.done(t.buf, nil)
	}
	return nil
}

// Abort ends every payload still incomplete: each done gets err.
func (a *Assembler) Abort(err error) {
	a.mu.Lock()
	pending := a.pending
	a.pending = map[uint64]*transfer{}
	a.mu.Unlock()
	for _, t := range pending {
		t.done(nil, fmt.Errorf("%w: transfer %d: %w", ErrBadTransfer, t.hdr.Transfer, err))
	}
}
