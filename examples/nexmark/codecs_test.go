package nexmark

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/weirstream/weir/runtime"
)

// roundTrip checks codec on values made by gen: each value decodes to
// itself, and every strict prefix of its encoding and the encoding with a
// byte appended are refused with runtime.ErrDecode (never a panic).
func roundTrip[T any](t *testing.T, name string, codec binCodec[T], gen func(*rand.Rand) T) {
	t.Run(name, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 11))
		for range 200 {
			v := gen(r)
			b := codec.Append(nil, v)
			got, err := codec.Decode(b)
			if err != nil || !reflect.DeepEqual(got, v) {
				t.Fatalf("%+v encoded as %x decodes to %+v, %v", v, b, got, err)
			}
			for n := range len(b) {
				if _, err := codec.Decode(b[:n]); !errors.Is(err, runtime.ErrDecode) {
					t.Fatalf("%d of the %d bytes of %+v: %v, want ErrDecode", n, len(b), v, err)
				}
			}
			if _, err := codec.Decode(append(b, 0)); !errors.Is(err, runtime.ErrDecode) {
				t.Fatalf("%+v with a byte more: %v, want ErrDecode", v, err)
			}
		}
	})
}

func randStr(r *rand.Rand) string {
	b := make([]byte, r.IntN(40))
	for i := range b {
		b[i] = byte(r.IntN(256))
	}
	return string(b)
}

func randInt(r *rand.Rand) int64 {
	if r.IntN(4) == 0 {
		return -r.Int64()
	}
	return r.Int64N(1 << uint(r.IntN(62)+1))
}

func randBid(r *rand.Rand) Bid {
	return Bid{Auction: randInt(r), Bidder: randInt(r), Price: randInt(r), Channel: randStr(r), URL: randStr(r),
		DateTime: randInt(r), Extra: randStr(r)}
}

func randSlice[T any](r *rand.Rand, gen func(*rand.Rand) T) []T {
	n := r.IntN(4)
	if n == 0 {
		return nil
	}
	vs := make([]T, n)
	for i := range vs {
		vs[i] = gen(r)
	}
	return vs
}

// The queries' state codecs give back what they encode and refuse
// truncated or padded bytes with a decode error.
func TestStateCodecsRoundTripAndRefuseDamagedBytes(t *testing.T) {
	roundTrip(t, "int64s", int64sCodec, func(r *rand.Rand) []int64 { return randSlice(r, randInt) })
	roundTrip(t, "pair", pairCodec, func(r *rand.Rand) [2]int64 { return [2]int64{randInt(r), randInt(r)} })
	roundTrip(t, "bid", bidCodec, randBid)
	roundTrip(t, "q3 seller", q3SellerCodec, func(r *rand.Rand) q3Seller { return q3Seller{randStr(r), randStr(r), randStr(r)} })
	roundTrip(t, "q4 auction", q4AuctionCodec, func(r *rand.Rand) q4Auction {
		return q4Auction{Category: randInt(r), Start: randInt(r), Expires: randInt(r), Max: randInt(r), HasBid: r.IntN(2) == 0}
	})
	roundTrip(t, "q4 bids", q4BidsCodec, func(r *rand.Rand) []q4Bid {
		return randSlice(r, func(r *rand.Rand) q4Bid { return q4Bid{randInt(r), randInt(r)} })
	})
	roundTrip(t, "q5 result", q5ResultCodec, func(r *rand.Rand) Q5Result {
		return Q5Result{randInt(r), randInt(r), randInt(r), randInt(r)}
	})
	roundTrip(t, "q7 results", sliceCodec(q7ResultCodec), func(r *rand.Rand) []Q7Result {
		return randSlice(r, func(r *rand.Rand) Q7Result {
			return Q7Result{randInt(r), randInt(r), randInt(r), randInt(r), randStr(r), randInt(r)}
		})
	})
	roundTrip(t, "q7 acc", q7AccCodec, func(r *rand.Rand) q7Acc { return q7Acc{Bids: randSlice(r, randBid)} })
	roundTrip(t, "q8 acc", q8AccCodec, func(r *rand.Rand) q8Acc {
		return q8Acc{Name: randStr(r), Joined: r.IntN(2) == 0, Auctioned: r.IntN(2) == 0}
	})
}
