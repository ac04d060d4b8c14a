package nexmark

import (
	"encoding/binary"
	"fmt"

	"github.com/weirstream/weir/runtime"
)

// The queries' state codecs: compact binary encodings (varints and
// length-prefixed strings) instead of runtime's JSON default, as a Flink
// job declares its state's TypeInformation rather than falling back to
// Kryo. Every state value goes through a codec at each checkpoint on the
// heap backend and at each access on pebble. The formats are this
// package's: a savepoint of a query written before they changed does not
// restore.

// binCodec is a runtime.Codec from an append function and a read function.
type binCodec[T any] struct {
	put func(dst []byte, v T) []byte
	get func(r *reader) T
}

func (c binCodec[T]) Append(dst []byte, v T) []byte { return c.put(dst, v) }

func (c binCodec[T]) Decode(b []byte) (T, error) {
	r := reader{b: b}
	v := c.get(&r)
	if err := r.end(); err != nil {
		var zero T
		return zero, fmt.Errorf("%w %T: %w", runtime.ErrDecode, v, err)
	}
	return v, nil
}

// reader reads what the put functions append; the first fault (too few
// bytes, a bad varint) sticks, and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("bad varint at %d bytes left", len(r.b))
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.varint()
	if r.err != nil {
		return ""
	}
	if n < 0 || n > int64(len(r.b)) {
		r.err = fmt.Errorf("string of %d bytes with %d left", n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) bool() bool { return r.varint() != 0 }

// count reads a slice's length, bounded by the bytes left (every element
// takes at least one byte), so corrupt input cannot allocate much.
func (r *reader) count() int {
	n := r.varint()
	if r.err == nil && (n < 0 || n > int64(len(r.b))) {
		r.err = fmt.Errorf("%d elements with %d bytes left", n, len(r.b))
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

// end reports the first fault, or bytes left over.
func (r *reader) end() error {
	if r.err == nil && len(r.b) > 0 {
		return fmt.Errorf("%d bytes left over", len(r.b))
	}
	return r.err
}

func appendStr(dst []byte, s string) []byte {
	return append(binary.AppendVarint(dst, int64(len(s))), s...)
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 2) // varint 1
	}
	return append(dst, 0)
}

// sliceCodec encodes a slice as its length and its elements.
func sliceCodec[T any](elem binCodec[T]) binCodec[[]T] {
	return binCodec[[]T]{
		put: func(dst []byte, vs []T) []byte {
			dst = binary.AppendVarint(dst, int64(len(vs)))
			for _, v := range vs {
				dst = elem.put(dst, v)
			}
			return dst
		},
		get: func(r *reader) []T {
			n := r.count()
			if n == 0 {
				return nil
			}
			vs := make([]T, n)
			for i := range vs {
				vs[i] = elem.get(r)
			}
			return vs
		},
	}
}

var int64sCodec = sliceCodec(binCodec[int64]{
	put: binary.AppendVarint,
	get: func(r *reader) int64 { return r.varint() },
})

var pairCodec = binCodec[[2]int64]{
	put: func(dst []byte, v [2]int64) []byte { return binary.AppendVarint(binary.AppendVarint(dst, v[0]), v[1]) },
	get: func(r *reader) [2]int64 { return [2]int64{r.varint(), r.varint()} },
}

var bidCodec = binCodec[Bid]{
	put: func(dst []byte, b Bid) []byte {
		dst = binary.AppendVarint(dst, b.Auction)
		dst = binary.AppendVarint(dst, b.Bidder)
		dst = binary.AppendVarint(dst, b.Price)
		dst = appendStr(dst, b.Channel)
		dst = appendStr(dst, b.URL)
		dst = binary.AppendVarint(dst, b.DateTime)
		return appendStr(dst, b.Extra)
	},
	get: func(r *reader) Bid {
		return Bid{Auction: r.varint(), Bidder: r.varint(), Price: r.varint(), Channel: r.str(), URL: r.str(),
			DateTime: r.varint(), Extra: r.str()}
	},
}

var q3SellerCodec = binCodec[q3Seller]{
	put: func(dst []byte, s q3Seller) []byte {
		return appendStr(appendStr(appendStr(dst, s.Name), s.City), s.State)
	},
	get: func(r *reader) q3Seller { return q3Seller{Name: r.str(), City: r.str(), State: r.str()} },
}

var q4AuctionCodec = binCodec[q4Auction]{
	put: func(dst []byte, a q4Auction) []byte {
		dst = binary.AppendVarint(dst, a.Category)
		dst = binary.AppendVarint(dst, a.Start)
		dst = binary.AppendVarint(dst, a.Expires)
		dst = binary.AppendVarint(dst, a.Max)
		return appendBool(dst, a.HasBid)
	},
	get: func(r *reader) q4Auction {
		return q4Auction{Category: r.varint(), Start: r.varint(), Expires: r.varint(), Max: r.varint(), HasBid: r.bool()}
	},
}

var q4BidsCodec = sliceCodec(binCodec[q4Bid]{
	put: func(dst []byte, b q4Bid) []byte {
		return binary.AppendVarint(binary.AppendVarint(dst, b.Time), b.Price)
	},
	get: func(r *reader) q4Bid { return q4Bid{Time: r.varint(), Price: r.varint()} },
})

var q5ResultCodec = binCodec[Q5Result]{
	put: func(dst []byte, v Q5Result) []byte {
		dst = binary.AppendVarint(dst, v.Auction)
		dst = binary.AppendVarint(dst, v.Num)
		dst = binary.AppendVarint(dst, v.Start)
		return binary.AppendVarint(dst, v.End)
	},
	get: func(r *reader) Q5Result {
		return Q5Result{Auction: r.varint(), Num: r.varint(), Start: r.varint(), End: r.varint()}
	},
}

var q7ResultCodec = binCodec[Q7Result]{
	put: func(dst []byte, v Q7Result) []byte {
		dst = binary.AppendVarint(dst, v.Auction)
		dst = binary.AppendVarint(dst, v.Price)
		dst = binary.AppendVarint(dst, v.Bidder)
		dst = binary.AppendVarint(dst, v.DateTime)
		dst = appendStr(dst, v.Extra)
		return binary.AppendVarint(dst, v.WindowEnd)
	},
	get: func(r *reader) Q7Result {
		return Q7Result{Auction: r.varint(), Price: r.varint(), Bidder: r.varint(), DateTime: r.varint(), Extra: r.str(),
			WindowEnd: r.varint()}
	},
}

var q7AccCodec = binCodec[q7Acc]{
	put: func(dst []byte, a q7Acc) []byte { return bidsCodec.put(dst, a.Bids) },
	get: func(r *reader) q7Acc { return q7Acc{Bids: bidsCodec.get(r)} },
}

var bidsCodec = sliceCodec(bidCodec)

var q8AccCodec = binCodec[q8Acc]{
	put: func(dst []byte, a q8Acc) []byte {
		return appendBool(appendBool(appendStr(dst, a.Name), a.Joined), a.Auctioned)
	},
	get: func(r *reader) q8Acc { return q8Acc{Name: r.str(), Joined: r.bool(), Auctioned: r.bool()} },
}
