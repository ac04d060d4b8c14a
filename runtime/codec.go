package runtime

import (
	"encoding"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
)

// A Codec turns values of T into bytes and back. Codecs are used for keys
// (hashing into key groups), for state snapshots, and for records that cross a
// process boundary. Append must not retain dst; Decode must not retain b.
//
// Records passed between tasks of one process are handed over as Go values
// and are not encoded.
type Codec[T any] interface {
	Append(dst []byte, v T) []byte
	Decode(b []byte) (T, error)
}

// ErrDecode is wrapped by every error a built-in codec returns for bytes it
// cannot decode.
var ErrDecode = errors.New("cannot decode")

type stringCodec struct{}

func (stringCodec) Append(dst []byte, v string) []byte { return append(dst, v...) }
func (stringCodec) Decode(b []byte) (string, error)    { return string(b), nil }

type bytesCodec struct{}

func (bytesCodec) Append(dst, v []byte) []byte { return append(dst, v...) }
func (bytesCodec) Decode(b []byte) ([]byte, error) {
	return append([]byte(nil), b...), nil
}

type int64Codec struct{}

func (int64Codec) Append(dst []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(v))
}
func (int64Codec) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w int64 from %d bytes", ErrDecode, len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

type intCodec struct{}

func (intCodec) Append(dst []byte, v int) []byte { return int64Codec{}.Append(dst, int64(v)) }
func (intCodec) Decode(b []byte) (int, error) {
	v, err := int64Codec{}.Decode(b)
	return int(v), err
}

type uint64Codec struct{}

func (uint64Codec) Append(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }
func (uint64Codec) Decode(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w uint64 from %d bytes", ErrDecode, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

type float64Codec struct{}

func (float64Codec) Append(dst []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(v))
}
func (float64Codec) Decode(b []byte) (float64, error) {
	u, err := uint64Codec{}.Decode(b)
	return math.Float64frombits(u), err
}

// JSONCodec encodes T with encoding/json. It is the documented default for
// struct types: exported fields only, field order by declaration. Implement
// Codec yourself where JSON is too slow or too lossy.
type JSONCodec[T any] struct{}

// Append implements Codec.
func (JSONCodec[T]) Append(dst []byte, v T) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// json.Marshal fails for unsupported types (channels, functions,
		// cyclic values), which CheckDefaultCodec rejects when the job is
		// built, or a dynamic value of an interface field. The runtime
		// turns this panic into a task failure.
		panic(fmt.Sprintf("runtime: JSONCodec cannot encode %T: %v", v, err))
	}
	return append(dst, b...)
}

// Decode implements Codec.
func (JSONCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%w %T: %w", ErrDecode, v, err)
	}
	return v, nil
}

// StringCodec encodes strings as their bytes.
func StringCodec() Codec[string] { return stringCodec{} }

// BytesCodec encodes byte slices as themselves; Decode copies.
func BytesCodec() Codec[[]byte] { return bytesCodec{} }

// Int64Codec encodes int64 as 8 big-endian bytes.
func Int64Codec() Codec[int64] { return int64Codec{} }

// IntCodec encodes int as 8 big-endian bytes.
func IntCodec() Codec[int] { return intCodec{} }

// Uint64Codec encodes uint64 as 8 big-endian bytes.
func Uint64Codec() Codec[uint64] { return uint64Codec{} }

// Float64Codec encodes float64 as its IEEE 754 bits, big-endian.
func Float64Codec() Codec[float64] { return float64Codec{} }

// ErrUnsupportedType is wrapped by the errors of CheckDefaultCodec: T
// holds a type encoding/json cannot encode (a channel, a function, a
// complex number, an unsafe pointer, or a map whose keys are none of
// string, integer or encoding.TextMarshaler).
var ErrUnsupportedType = errors.New("type not supported by the default codec")

// CheckDefaultCodec reports whether DefaultCodec[T] can encode every value
// of T. KeyBy, Reduce, NewValueState and NewMapState call it when they are
// given no codec, so an unsupported type fails the job when it is built (or
// its state declared), never at the first snapshot. A field of interface
// type is checked only at run time (its dynamic value), where a failure to
// encode is a task failure.
func CheckDefaultCodec[T any]() error {
	t := reflect.TypeFor[T]()
	if err := jsonEncodable(t, map[reflect.Type]bool{}); err != nil {
		return fmt.Errorf("%w: %v: %w", ErrInvalidJob, t, err)
	}
	return nil
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func jsonEncodable(t reflect.Type, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if t.Implements(jsonMarshalerType) || reflect.PointerTo(t).Implements(jsonMarshalerType) ||
		t.Implements(textMarshalerType) || reflect.PointerTo(t).Implements(textMarshalerType) {
		return nil
	}
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return fmt.Errorf("%w: %v", ErrUnsupportedType, t)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return jsonEncodable(t.Elem(), seen)
	case reflect.Map:
		k := t.Key()
		switch {
		case k.Kind() == reflect.String, k.Kind() >= reflect.Int && k.Kind() <= reflect.Uintptr,
			k.Implements(textMarshalerType):
		default:
			return fmt.Errorf("%w: map key %v", ErrUnsupportedType, k)
		}
		return jsonEncodable(t.Elem(), seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if (!f.IsExported() && !f.Anonymous) || f.Tag.Get("json") == "-" {
				continue
			}
			if err := jsonEncodable(f.Type, seen); err != nil {
				return fmt.Errorf("field %s: %w", f.Name, err)
			}
		}
	}
	return nil
}

// DefaultCodec returns the built-in codec for strings, byte slices, int,
// int64, uint64 and float64, and JSONCodec for every other type. Check
// with CheckDefaultCodec that JSON can encode T.
func DefaultCodec[T any]() Codec[T] {
	var zero T
	var c any
	switch any(zero).(type) {
	case string:
		c = stringCodec{}
	case []byte:
		c = bytesCodec{}
	case int64:
		c = int64Codec{}
	case int:
		c = intCodec{}
	case uint64:
		c = uint64Codec{}
	case float64:
		c = float64Codec{}
	default:
		return JSONCodec[T]{}
	}
	return c.(Codec[T])
}

// appendFrame appends a uvarint length and b.
func appendFrame(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// readFrame reads one frame written by appendFrame.
func readFrame(b []byte) (frame, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, fmt.Errorf("%w: truncated frame", ErrDecode)
	}
	return b[k : k+int(n)], b[k+int(n):], nil
}
