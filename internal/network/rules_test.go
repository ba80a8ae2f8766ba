package network

import "testing"

func TestMatchRule(t *testing.T) {
	rules, err := ParseRules(map[string][]map[string]string{
		"api.example.com":  {{"A": "exact"}},
		"*.example.com":    {{"A": "wide"}},
		"*.eu.example.com": {{"A": "narrow"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{
		"api.example.com":  "exact",
		"API.Example.COM.": "exact",
		"x.example.com":    "wide",
		"a.b.example.com":  "wide",
		"x.eu.example.com": "narrow",
		"example.com":      "",
		"eu.example.com":   "wide",
		"example.com.evil": "",
		"1.2.3.4":          "",
	} {
		got := ""
		if r := MatchRule(rules, host); r != nil {
			got = r.Headers[0].Value
		}
		if got != want {
			t.Errorf("MatchRule(%q) = %q, want %q", host, got, want)
		}
	}
}

func TestParseRulesRefuses(t *testing.T) {
	for _, tc := range []struct {
		what  string
		rules map[string][]map[string]string
	}{
		{"a bare *", map[string][]map[string]string{"*": {{"A": "b"}}}},
		{"a wildcard over a top-level domain", map[string][]map[string]string{"*.com": {{"A": "b"}}}},
		{"an address", map[string][]map[string]string{"10.0.0.1": {{"A": "b"}}}},
		{"Host", map[string][]map[string]string{"a.test": {{"Host": "evil.test"}}}},
		{"Content-Length", map[string][]map[string]string{"a.test": {{"content-length": "0"}}}},
		{"a line break", map[string][]map[string]string{"a.test": {{"A": "b\r\nX-Evil: 1"}}}},
		{"a bad header name", map[string][]map[string]string{"a.test": {{"A B": "c"}}}},
		{"the same host twice", map[string][]map[string]string{"a.test": {{"A": "b"}}, "A.test": {{"A": "b"}}}},
	} {
		if _, err := ParseRules(tc.rules); err == nil {
			t.Errorf("%s: accepted", tc.what)
		}
	}
}
