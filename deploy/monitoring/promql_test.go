package monitoring_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlFunctions are PromQL's functions: a name before "(" that is not
// one of these is a mistake.
var promqlFunctions = map[string]bool{}

// promqlKeywords are PromQL's words that are neither metrics nor
// functions (aggregations may be followed by by/without before "(").
var promqlKeywords = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
		count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_avg
		histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum hour
		idelta increase irate label_join label_replace last_over_time ln log10 log2 max_over_time min_over_time minute
		month predict_linear present_over_time quantile_over_time rate resets round scalar sgn sort sort_desc
		sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector year
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`) {
		promqlFunctions[f] = true
	}
	for _, k := range strings.Fields(`and or unless bool offset by without on ignoring group_left group_right inf nan atan2
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`) {
		promqlKeywords[k] = true
	}
}

// groupingWords take a parenthesised list of label names.
var groupingWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true}

// metricNames returns the metric names a PromQL expression (with Grafana's
// $variables) reads, in order, each once. It is a tokenizer, not a
// parser: it skips strings, label matchers {...}, ranges [...], label lists
// after by/without/on/ignoring/group_left/group_right, numbers and
// durations, $variables, keywords and function names, and what is left is
// metric names.
func metricNames(expr string) ([]string, error) {
	var names []string
	i := 0
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			end, err := skipBalanced(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '}' || c == ']':
			return nil, fmt.Errorf("unbalanced %q at %d in %q", c, i, expr)
		case c == '$':
			i++
			if i < len(expr) && expr[i] == '{' {
				end, err := skipBalanced(expr, i)
				if err != nil {
					return nil, err
				}
				i = end
				continue
			}
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
		case isDigit(c) || c == '.' && i+1 < len(expr) && isDigit(expr[i+1]):
			// Numbers, and durations (5m, 1h30m) after offset.
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := i
			for next < len(expr) && strings.IndexByte(" \t\r\n", expr[next]) >= 0 {
				next++
			}
			paren := next < len(expr) && expr[next] == '('
			switch {
			case groupingWords[word]:
				if paren {
					end, err := skipBalanced(expr, next)
					if err != nil {
						return nil, err
					}
					i = end
				}
			case paren && !promqlFunctions[word]:
				return nil, fmt.Errorf("unknown function %s in %q", word, expr)
			case paren, promqlKeywords[word]:
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
		default:
			if c > 0x7e {
				return nil, fmt.Errorf("unexpected byte %q at %d in %q", c, i, expr)
			}
			i++ // operators, parentheses, commas
		}
	}
	return names, nil
}

// skipString returns the index after the string literal starting at i.
func skipString(s string, i int) (int, error) {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && quote != '`':
			j++
		case s[j] == quote:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d in %q", i, s)
}

// skipBalanced returns the index after the bracket opened at i closes,
// skipping strings and nested brackets.
func skipBalanced(s string, i int) (int, error) {
	closing := map[byte]byte{'{': '}', '[': ']', '(': ')'}
	stack := []byte{closing[s[i]]}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; c {
		case '"', '\'', '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case '{', '[', '(':
			stack = append(stack, closing[c])
		case '}', ']', ')':
			if c != stack[len(stack)-1] {
				return 0, fmt.Errorf("unbalanced %q at %d in %q", c, j, s)
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unclosed %q at %d in %q", s[i], i, s)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

func TestMetricNamesTokenizer(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
		err  string
	}{
		{expr: `up == 0`, want: []string{"up"}},
		{expr: `aenv_sandboxes_live`, want: []string{"aenv_sandboxes_live"}},
		{expr: `sum by (instance, le) (rate(a_bucket{job="x", route=~"POST /sandboxes/\\{id\\}", code!~'5..'}[5m]))`,
			want: []string{"a_bucket"}},
		{expr: `histogram_quantile(0.99, sum without (pod) (rate(h_bucket[$__rate_interval])))`, want: []string{"h_bucket"}},
		{expr: `a / on (instance) group_left (node) b > 0.9 and c unless d or e offset 1h`,
			want: []string{"a", "b", "c", "d", "e"}},
		{expr: `topk(10, rate(x{instance=~"$instance"}[${interval}])) * 1e3 + .5`, want: []string{"x"}},
		{expr: "max(a{l=`b}c`}) # a comment naming not_a_metric\n - a", want: []string{"a"}},
		{expr: `sum(rate(a_total[5m])) / sum(rate(b_total[5m]))`, want: []string{"a_total", "b_total"}},
		{expr: `x[5m:1m] @ 100`, want: []string{"x"}},
		{expr: `count(a) by (node)`, want: []string{"a"}},
		{expr: `namespace:rule:rate5m > bool 1`, want: []string{"namespace:rule:rate5m"}},
		{expr: `rat(x[5m])`, err: "unknown function rat"},
		{expr: `x{a="b"`, err: "unclosed"},
		{expr: `x{a="b}`, err: "unterminated string"},
		{expr: `x]`, err: "unbalanced"},
		{expr: `sum(x[5m)]`, err: "unbalanced"},
	} {
		got, err := metricNames(tc.expr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.expr, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.expr, got, tc.want)
		}
	}
}
