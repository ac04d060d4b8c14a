package checkpoint

import (
	"errors"
	"testing"
)

func TestEncodedCheckpointRoundTripsAndFailsVerificationWhenDamaged(t *testing.T) {
	want := testCheckpoint("job-a", 7)
	b, err := EncodeCompleted(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCompleted("job-a", 7, b)
	if err != nil {
		t.Fatal(err)
	}
	assertCheckpoint(t, got, want)
	sum, err := DecodeSummary("job-a", 7, b)
	if err != nil || sum.ID != 7 || sum.Size != want.Size() || len(sum.Stats) != len(want.Stats) {
		t.Fatalf("summary %+v, %v", sum, err)
	}

	for name, damaged := range map[string][]byte{
		"another job's id": b, // decoded as checkpoint 8: the CRC covers the key
		"flipped byte":     flip(b, len(b)/3),
		"truncated":        b[:len(b)-1],
		"empty":            nil,
	} {
		id := ID(7)
		if name == "another job's id" {
			id = 8
		}
		if _, err := DecodeCompleted("job-a", id, damaged); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decode error %v, want ErrCorrupt", name, err)
		}
	}

	// State damaged, handles intact: a restore passing over it can still
	// commit its transactions.
	metaDamaged := flip(b, len(recordMagic)+8)
	_, err = DecodeCompleted("job-a", 7, metaDamaged)
	sk := SkippedOf("job-a", 7, metaDamaged, err)
	if !sk.HandlesOK || len(sk.Handles) != 2 || !errors.Is(sk.Err, ErrCorrupt) {
		t.Fatalf("skipped %+v: want both handles and a corrupt error", sk)
	}
	if sk := SkippedOf("job-a", 7, nil, nil); sk.HandlesOK || !errors.Is(sk.Err, ErrCorrupt) {
		t.Fatalf("missing object skipped as %+v", sk)
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0xff
	return c
}
