// Package leasename holds the one rule for the names pgfence writes to its
// tables (lease names, semaphore names, owner ids, job names, slot keys):
// non-empty, at most a given number of bytes, valid UTF-8, and without C0
// control characters (U+0000-U+001F) or DEL (U+007F), which would forge
// lines in operators' terminals and logs. C1 controls (U+0080-U+009F) are
// letters to this rule, as they are to the table; a lone byte 0x80-0x9F is
// not UTF-8.
//
// [Check] answers what is wrong, not a message: each package words the
// problem under its own prefix.
package leasename

import (
	"strings"
	"unicode/utf8"
)

// Kind is what is wrong with a name.
type Kind int

// The kinds of [Problem], in the order [Check] looks for them.
const (
	// Empty: the name is "".
	Empty Kind = iota + 1
	// TooLong: the name is longer than the maximum, in bytes.
	TooLong
	// NotUTF8: the name is not valid UTF-8.
	NotUTF8
	// NUL: the name holds a NUL byte (U+0000), which the text type refuses.
	NUL
	// Control: the name holds a C0 control character other than NUL, or DEL.
	Control
)

// Problem is what [Check] found wrong with a name.
type Problem struct {
	// Kind is what is wrong.
	Kind Kind
	// Len is the name's length in bytes.
	Len int
	// Max is the longest length allowed, in bytes, the limit passed to [Check].
	Max int
	// Index is the byte offset of the NUL or control character (NUL and
	// Control only; 0 otherwise).
	Index int
	// Char is the NUL or control character (NUL and Control only).
	Char rune
}

// Check returns nil if v is a valid name of at most limit bytes, and what is
// wrong with it otherwise. When several things are wrong, the first of
// Empty, TooLong, NotUTF8, NUL and Control wins; a NUL anywhere wins over
// an earlier control character, and Index is that of the first one of its
// kind.
func Check(v string, limit int) *Problem {
	p := &Problem{Len: len(v), Max: limit}
	switch {
	case v == "":
		p.Kind = Empty
		return p
	case len(v) > limit:
		p.Kind = TooLong
		return p
	case !utf8.ValidString(v):
		p.Kind = NotUTF8
		return p
	}
	if i := strings.IndexByte(v, 0); i >= 0 {
		p.Kind, p.Index = NUL, i
		return p
	}
	// The controls are ASCII, so the rune is the byte at i.
	if i := strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		p.Kind, p.Index, p.Char = Control, i, rune(v[i])
		return p
	}
	return nil
}
