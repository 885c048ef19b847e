package trace

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendEvent appends one event object. Field order is fixed so that
// output is byte-for-byte reproducible.
func appendEvent(b []byte, e *event, args []Arg) []byte {
	b = append(b, `{"ph":"`...)
	b = append(b, e.ph)
	b = append(b, `","name":`...)
	b = appendString(b, e.name)
	if e.cat != "" {
		b = append(b, `,"cat":`...)
		b = appendString(b, e.cat)
	}
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(e.pid), 10)
	if e.ph != 'C' {
		b = append(b, `,"tid":`...)
		b = strconv.AppendInt(b, int64(e.tid), 10)
	}
	b = append(b, `,"ts":`...)
	b = appendMicros(b, e.ts)
	switch e.ph {
	case 'X':
		b = append(b, `,"dur":`...)
		b = appendMicros(b, e.dur)
	case 'i':
		b = append(b, `,"s":"t"`...)
	case 's':
		b = append(b, `,"id":`...)
		b = strconv.AppendUint(b, e.id, 10)
	case 'f':
		b = append(b, `,"id":`...)
		b = strconv.AppendUint(b, e.id, 10)
		b = append(b, `,"bp":"e"`...)
	}
	if len(args) > 0 {
		b = append(b, `,"args":{`...)
		for i, a := range args {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, a.Key)
			b = append(b, ':')
			b = appendArg(b, a)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendMeta(b []byte, m meta) []byte {
	b = append(b, `{"ph":"M","name":"`...)
	switch m.kind {
	case metaProcessName:
		b = append(b, `process_name"`...)
	case metaProcessSort:
		b = append(b, `process_sort_index"`...)
	case metaThreadName:
		b = append(b, `thread_name"`...)
	default:
		b = append(b, `thread_sort_index"`...)
	}
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(m.pid), 10)
	if m.kind >= metaThreadName {
		b = append(b, `,"tid":`...)
		b = strconv.AppendInt(b, int64(m.tid), 10)
	}
	if m.kind == metaProcessName || m.kind == metaThreadName {
		b = append(b, `,"args":{"name":`...)
		b = appendString(b, m.name)
	} else {
		b = append(b, `,"args":{"sort_index":`...)
		b = strconv.AppendInt(b, int64(m.index), 10)
	}
	return append(b, "}}"...)
}

func appendArg(b []byte, a Arg) []byte {
	switch a.kind {
	case argInt:
		return strconv.AppendInt(b, a.i, 10)
	case argFloat:
		if math.IsNaN(a.f) || math.IsInf(a.f, 0) {
			return appendString(b, strconv.FormatFloat(a.f, 'g', -1, 64))
		}
		return strconv.AppendFloat(b, a.f, 'g', -1, 64)
	default:
		return appendString(b, a.s)
	}
}

// appendMicros writes d in microseconds, exactly: the integer part, then
// up to three decimals for the nanoseconds, trailing zeros trimmed.
func appendMicros(b []byte, d time.Duration) []byte {
	u := uint64(d)
	if d < 0 {
		b = append(b, '-')
		u = -u // two's complement magnitude; exact even for math.MinInt64
	}
	b = strconv.AppendUint(b, u/1000, 10)
	frac := u % 1000
	if frac == 0 {
		return b
	}
	digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
	n := 3
	for digits[n-1] == '0' {
		n--
	}
	b = append(b, '.')
	return append(b, digits[:n]...)
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string. Control characters are escaped
// and invalid UTF-8 becomes U+FFFD, so the output is always valid JSON.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
