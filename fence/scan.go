package fence

import (
	"fmt"
	"strings"
)

// maxParams is the highest parameter number PostgreSQL accepts in one
// statement (the protocol counts parameters in an int16).
const maxParams = 65535

// scanParams checks that a caller's SQL fragment is one self-contained
// piece of an expression, and returns the $n placeholders it uses, as a set,
// and the highest one (0 when there is none). It follows PostgreSQL's lexer
// (with standard_conforming_strings on, the default since 9.1):
// placeholders inside string constants ('...', E'...'), quoted identifiers
// ("..."), dollar-quoted strings ($$...$$, $tag$...$tag$) and identifiers
// that contain $ (a$1) are not placeholders.
//
// A fragment is rejected when SQL appended after it could be read as part
// of it, or when it could end the clause it is placed in: an unterminated
// string constant, quoted identifier or dollar quote; a comment (-- or /*);
// a parenthesis or bracket that it does not close, or that closes one it did
// not open; a semicolon; and a backslash right before a quote in a standard
// string constant ('a\'), which a server with standard_conforming_strings
// off reads as an escaped quote, so the string would not end where it
// seems to. $0 or a number above 65535 is an error too.
func scanParams(frag string, used map[int]struct{}) (highest int, err error) {
	var open []int // byte offsets of the ( and [ not yet closed
	n := len(frag)
	for i := 0; i < n; {
		c := frag[i]
		switch {
		case c == '\'':
			escapes := i > 0 && (frag[i-1] == 'e' || frag[i-1] == 'E') && (i < 2 || !isIdentChar(frag[i-2]))
			j := i + 1
			backslashes := 0 // run of backslashes before frag[j], in a standard string
			for {
				if j >= n {
					return 0, fmt.Errorf("unterminated string constant at byte %d", i)
				}
				if escapes && frag[j] == '\\' {
					j += 2
					continue
				}
				if frag[j] == '\'' {
					if backslashes%2 == 1 {
						return 0, fmt.Errorf("backslash before a quote in the string constant at byte %d: "+
							"it ends the string only with standard_conforming_strings on; write E'...' with \\' or double the quote", i)
					}
					if j+1 < n && frag[j+1] == '\'' {
						j += 2
						backslashes = 0
						continue
					}
					break
				}
				if frag[j] == '\\' {
					backslashes++
				} else {
					backslashes = 0
				}
				j++
			}
			i = j + 1
		case c == '"':
			j := i + 1
			for {
				if j >= n {
					return 0, fmt.Errorf("unterminated quoted identifier at byte %d", i)
				}
				if frag[j] == '"' {
					if j+1 < n && frag[j+1] == '"' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			i = j + 1
		case c == '-' && i+1 < n && frag[i+1] == '-', c == '/' && i+1 < n && frag[i+1] == '*':
			return 0, fmt.Errorf("comment %q at byte %d: fragments may not contain comments", frag[i:i+2], i)
		case c == ';':
			return 0, fmt.Errorf("semicolon at byte %d: a fragment is part of one statement", i)
		case c == '(' || c == '[':
			open = append(open, i)
			i++
		case c == ')' || c == ']':
			want := byte('(')
			if c == ']' {
				want = '['
			}
			if len(open) == 0 || frag[open[len(open)-1]] != want {
				return 0, fmt.Errorf("unbalanced %q at byte %d: it closes no %q of the fragment", c, i, want)
			}
			open = open[:len(open)-1]
			i++
		case c == '$' && i > 0 && isIdentChar(frag[i-1]):
			// Part of an identifier such as a$1 or a$b.
			i++
		case c == '$' && i+1 < n && isDigit(frag[i+1]):
			j, num := i+1, 0
			for j < n && isDigit(frag[j]) {
				if num <= maxParams {
					num = num*10 + int(frag[j]-'0')
				}
				j++
			}
			if num == 0 || num > maxParams {
				return 0, fmt.Errorf("placeholder %s at byte %d is out of range 1..%d", frag[i:j], i, maxParams)
			}
			used[num] = struct{}{}
			highest = max(highest, num)
			i = j
		case c == '$':
			// A dollar quote opens with $$ or $tag$, tag an identifier
			// without $. Anything else is a lone $, left to the server.
			j := i + 1
			if j < n && isIdentStart(frag[j]) {
				j++
				for j < n && isIdentChar(frag[j]) && frag[j] != '$' {
					j++
				}
			}
			if j >= n || frag[j] != '$' {
				i++
				continue
			}
			tag := frag[i : j+1]
			end := strings.Index(frag[j+1:], tag)
			if end < 0 {
				return 0, fmt.Errorf("unterminated dollar-quoted string %s at byte %d", tag, i)
			}
			i = j + 1 + end + len(tag)
		default:
			i++
		}
	}
	if len(open) > 0 {
		at := open[len(open)-1]
		return 0, fmt.Errorf("unbalanced %q at byte %d: the fragment does not close it", frag[at], at)
	}
	return highest, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// checkParams validates a statement's fragments (see scanParams) and their
// placeholders against the number of arguments the caller passes: together
// they must use exactly $1..$nargs, each at least once.
func checkParams(nargs int, frags ...fragment) error {
	if nargs < 0 {
		return fmt.Errorf("fence: negative argument count %d", nargs)
	}
	used := make(map[int]struct{})
	highest := 0
	for _, f := range frags {
		h, err := scanParams(f.sql, used)
		if err != nil {
			return fmt.Errorf("fence: %s fragment %q: %w", f.what, f.sql, err)
		}
		highest = max(highest, h)
	}
	if highest != nargs {
		return fmt.Errorf("fence: the fragments use placeholders up to $%d but %d argument(s) were given; "+
			"the fencing token takes $%d", highest, nargs, nargs+1)
	}
	for p := 1; p <= nargs; p++ {
		if _, ok := used[p]; !ok {
			return fmt.Errorf("fence: placeholder $%d is never used in the fragments, "+
				"so PostgreSQL could not infer its type", p)
		}
	}
	return nil
}

// fragment is a piece of the caller's SQL and the builder method that gave it.
type fragment struct {
	what string
	sql  string
}
