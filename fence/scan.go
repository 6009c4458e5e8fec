package fence

import (
	"fmt"
	"strings"
)

// maxParams is the highest parameter number PostgreSQL accepts in one
// statement (the protocol counts parameters in an int16).
const maxParams = 65535

// scanParams returns the $n placeholders used in a caller's SQL fragment, as
// a set, and the highest one (0 when there is none). Placeholders inside
// string constants ('...', E'...'), quoted identifiers ("..."), comments (--
// and nested /* */), dollar-quoted strings ($$...$$, $tag$...$tag$) and
// identifiers that contain $ (a$1) are not placeholders, as in PostgreSQL's
// lexer (with standard_conforming_strings on, the default since 9.1). An
// unterminated quote or comment, $0, or a number above 65535 is an error.
// openComment reports that frag ends inside a -- comment, so SQL appended
// after it must start on a new line.
func scanParams(frag string, used map[int]struct{}) (highest int, openComment bool, err error) {
	n := len(frag)
	for i := 0; i < n; {
		c := frag[i]
		switch {
		case c == '\'':
			escapes := i > 0 && (frag[i-1] == 'e' || frag[i-1] == 'E') && (i < 2 || !isIdentChar(frag[i-2]))
			j := i + 1
			for {
				if j >= n {
					return 0, false, fmt.Errorf("unterminated string constant at byte %d", i)
				}
				if escapes && frag[j] == '\\' {
					j += 2
					continue
				}
				if frag[j] == '\'' {
					if j+1 < n && frag[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			i = j + 1
		case c == '"':
			j := i + 1
			for {
				if j >= n {
					return 0, false, fmt.Errorf("unterminated quoted identifier at byte %d", i)
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
		case c == '-' && i+1 < n && frag[i+1] == '-':
			j := strings.IndexByte(frag[i:], '\n')
			if j < 0 {
				i, openComment = n, true
			} else {
				i += j + 1
			}
		case c == '/' && i+1 < n && frag[i+1] == '*':
			depth, j := 1, i+2
			for depth > 0 {
				if j+1 >= n {
					return 0, false, fmt.Errorf("unterminated /* comment at byte %d", i)
				}
				switch {
				case frag[j] == '/' && frag[j+1] == '*':
					depth++
					j += 2
				case frag[j] == '*' && frag[j+1] == '/':
					depth--
					j += 2
				default:
					j++
				}
			}
			i = j
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
				return 0, false, fmt.Errorf("placeholder %s at byte %d is out of range 1..%d", frag[i:j], i, maxParams)
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
				return 0, false, fmt.Errorf("unterminated dollar-quoted string %s at byte %d", tag, i)
			}
			i = j + 1 + end + len(tag)
		default:
			i++
		}
	}
	return highest, openComment, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// checkParams validates the placeholders of a statement's fragments against
// the number of arguments the caller passes: together they must use exactly
// $1..$nargs, each at least once.
func checkParams(nargs int, frags ...fragment) error {
	if nargs < 0 {
		return fmt.Errorf("fence: negative argument count %d", nargs)
	}
	used := make(map[int]struct{})
	highest := 0
	for _, f := range frags {
		h, _, err := scanParams(f.sql, used)
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

// closed returns frag ready to have SQL appended: with a newline added when
// it ends inside a -- comment, which would otherwise swallow what follows.
// Call it on fragments checkParams accepted.
func closed(frag string) string {
	if _, open, err := scanParams(frag, map[int]struct{}{}); err == nil && open {
		return frag + "\n"
	}
	return frag
}
