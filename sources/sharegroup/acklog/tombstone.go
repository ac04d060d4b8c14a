package acklog

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Headers of a tombstone (Tombstones): the deleted marker's ack-log offset
// and the outcome of its transaction ("committed" or "aborted").
const (
	HeaderMarkerOffset = "weir.marker.offset"
	HeaderMarkerStatus = "weir.marker.status"
)

// tombstoneHeadersOf returns the headers of the tombstone of the marker at
// offset whose transaction ended with st.
func tombstoneHeadersOf(offset int64, st Status) []kgo.RecordHeader {
	return []kgo.RecordHeader{
		{Key: HeaderMarkerOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		{Key: HeaderMarkerStatus, Value: []byte(st.String())},
	}
}

// tombstoneHeaders reads what tombstoneHeadersOf wrote; ok is false when a
// header is missing or unreadable.
func tombstoneHeaders(hs []kgo.RecordHeader) (offset int64, st Status, ok bool) {
	var haveOff, haveSt bool
	for _, h := range hs {
		switch h.Key {
		case HeaderMarkerOffset:
			n, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil || n < 0 {
				return 0, 0, false
			}
			offset, haveOff = n, true
		case HeaderMarkerStatus:
			switch string(h.Value) {
			case Committed.String():
				st = Committed
			case Aborted.String():
				st = Aborted
			default:
				return 0, 0, false
			}
			haveSt = true
		}
	}
	return offset, st, haveOff && haveSt
}

// markerOfKey reads back what Marker.Key encodes (every field but the
// ranges), and false if key is not a marker's key.
func markerOfKey(key string) (Marker, bool) {
	rest, ok := strings.CutPrefix(key, "weir-ack/")
	if !ok {
		return Marker{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 6 {
		return Marker{}, false
	}
	var m Marker
	var err error
	unescape := func(s string) string {
		if err != nil {
			return ""
		}
		var v string
		v, err = url.PathUnescape(s)
		return v
	}
	m.Group, m.Member, m.TransactionalID = unescape(parts[0]), unescape(parts[1]), unescape(parts[2])
	if err != nil {
		return Marker{}, false
	}
	if m.ProducerID, err = strconv.ParseInt(parts[3], 10, 64); err != nil {
		return Marker{}, false
	}
	if m.Checkpoint, err = strconv.ParseUint(parts[4], 10, 64); err != nil {
		return Marker{}, false
	}
	created, err := strconv.ParseInt(parts[5], 10, 64)
	if err != nil {
		return Marker{}, false
	}
	if created != 0 {
		m.CreatedAt = time.Unix(0, created)
	}
	return m, true
}
