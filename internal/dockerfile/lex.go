package dockerfile

import (
	"fmt"
	"strings"
	"unicode"
)

// line is one instruction: its keyword, the rest of it with continuations
// joined, and the number of the line it starts on.
type line struct {
	keyword string // upper case
	rest    string
	num     int
}

// split turns a Dockerfile's text into instructions: comments and blank
// lines dropped, lines ending in the escape character joined with the
// next. A "# escape=`" directive at the top changes that character.
func split(text string) ([]line, byte, error) {
	escape := byte('\\')
	raw := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	directives := true
	var out []line
	var cur *line
	for i, l := range raw {
		num := i + 1
		trimmed := strings.TrimSpace(l)
		if directives {
			if k, v, ok := directive(trimmed); ok {
				if k == "escape" {
					if v != "\\" && v != "`" {
						return nil, 0, fmt.Errorf("line %d: escape must be \\ or `", num)
					}
					escape = v[0]
				}
				continue
			}
			directives = false
		}
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur == nil) {
			continue // comments go even inside a continued instruction
		}
		if trimmed == "" {
			continue // an empty line inside a continued instruction
		}
		body := strings.TrimRightFunc(l, unicode.IsSpace)
		continued := strings.HasSuffix(body, string(escape))
		if continued {
			body = body[:len(body)-1]
		}
		if cur == nil {
			kw, rest, _ := strings.Cut(strings.TrimLeftFunc(body, unicode.IsSpace), " ")
			if k2, r2, ok := strings.Cut(kw, "\t"); ok {
				kw, rest = k2, r2+" "+rest
			}
			cur = &line{keyword: strings.ToUpper(kw), rest: strings.TrimLeftFunc(rest, unicode.IsSpace), num: num}
		} else {
			cur.rest += body
		}
		if !continued {
			cur.rest = strings.TrimSpace(cur.rest)
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		cur.rest = strings.TrimSpace(cur.rest)
		out = append(out, *cur)
	}
	return out, escape, nil
}

// directive reads a parser directive ("# name=value").
func directive(l string) (string, string, bool) {
	body, ok := strings.CutPrefix(l, "#")
	if !ok {
		return "", "", false
	}
	k, v, ok := strings.Cut(body, "=")
	k = strings.ToLower(strings.TrimSpace(k))
	if !ok || (k != "escape" && k != "syntax" && k != "check") {
		return "", "", false
	}
	return k, strings.TrimSpace(v), true
}

// words splits s into shell-like words: quotes group, the escape
// character protects the next one, and when vars is not nil $NAME,
// ${NAME}, ${NAME:-word} and ${NAME:+word} are replaced (not inside
// single quotes), the way Docker expands ENV, COPY, WORKDIR and the like.
func words(s string, escape byte, vars map[string]string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == escape && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				switch {
				case s[j] == escape && j+1 < len(s) && (s[j+1] == '"' || s[j+1] == '$' || s[j+1] == escape):
					j++
					cur.WriteByte(s[j])
				case s[j] == '$' && vars != nil:
					n, err := expand(s[j:], vars, &cur)
					if err != nil {
						return nil, err
					}
					j += n - 1
				default:
					cur.WriteByte(s[j])
				}
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			i = j
			inWord = true
		case c == '$' && vars != nil:
			n, err := expand(s[i:], vars, &cur)
			if err != nil {
				return nil, err
			}
			i += n - 1
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// expand writes the value of the variable reference at the start of s
// (which begins with "$") and returns how many bytes it took.
func expand(s string, vars map[string]string, w *strings.Builder) (int, error) {
	if len(s) < 2 {
		w.WriteByte('$')
		return 1, nil
	}
	if s[1] != '{' {
		n := 1
		for n < len(s) && isNameByte(s[n], n == 1) {
			n++
		}
		if n == 1 {
			w.WriteByte('$')
			return 1, nil
		}
		w.WriteString(vars[s[1:n]])
		return n, nil
	}
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return 0, fmt.Errorf("missing } in %q", s)
	}
	ref := s[2:end]
	name, word, op := ref, "", ""
	if i := strings.Index(ref, ":"); i >= 0 {
		name, op, word = ref[:i], ref[i:min(i+2, len(ref))], ref[min(i+2, len(ref)):]
	}
	if !validName(name) {
		return 0, fmt.Errorf("bad substitution ${%s}", ref)
	}
	val, set := vars[name]
	switch op {
	case "":
		w.WriteString(val)
	case ":-":
		if set && val != "" {
			w.WriteString(val)
		} else {
			w.WriteString(word)
		}
	case ":+":
		if set && val != "" {
			w.WriteString(word)
		}
	default:
		return 0, fmt.Errorf("unsupported substitution ${%s}", ref)
	}
	return end + 1, nil
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i], i == 0) {
			return false
		}
	}
	return true
}
