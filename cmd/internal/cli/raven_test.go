package cli

import (
	"io"
	"strings"
	"testing"
)

func parseDispatch(env map[string]string) (*Dispatch, error) {
	s := NewSettings("test", func(k string) string { return env[k] }, io.Discard)
	d := DispatchSettings(s)
	return d, s.Parse(nil)
}

// RAVEN_URL is one URL, taken whole: a comma in its query is part of it, not the start
// of a second URL.
func TestRavenURLIsOneURL(t *testing.T) {
	t.Parallel()
	const u = "https://raven.example/hook?api_key=SECRET&fields=a,b,c"
	d, err := parseDispatch(map[string]string{"RAVEN_URL": u})
	if err != nil {
		t.Fatalf("RAVEN_URL with a comma in its query: %v", err)
	}
	if d.Raven.URL != u {
		t.Fatalf("RAVEN_URL read as %q, want %q whole", d.Raven.URL, u)
	}
}

// A URL setting that is not valid is refused naming the setting and showing the URL's
// scheme, host and path, never its user, password or query.
func TestURLSettingErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	secrets := []string{"SECRET", "pa55word", "svcuser", "api_key"}
	for _, c := range []struct {
		name, url string
		want      []string
	}{
		{"WrongScheme", "ftp://svcuser:pa55word@raven.example/hook?api_key=SECRET", []string{"ftp://raven.example/hook", "scheme must be http or https"}},
		{"WrongSchemeCommaInQuery", "ftp://raven.example/hook?api_key=SECRET,x", []string{"ftp://raven.example/hook"}},
		{"BadEscape", "http://svcuser:pa55%zzword@raven.example/hook?api_key=SECRET", []string{"cannot be read", "must be URL-escaped"}},
		{"HashInPassword", "http://svcuser:1234#pa55word@raven.example/hook?api_key=SECRET", []string{"http://(the rest hidden", "fragment"}},
		{"NoHost", "http:///hook?api_key=SECRET", []string{"no host"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseDispatch(map[string]string{"RAVEN_URL": c.url})
			if err == nil {
				t.Fatalf("RAVEN_URL=%s accepted", c.url)
			}
			for _, w := range append(c.want, "RAVEN_URL") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, s := range secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q shows %q", err, s)
				}
			}
		})
	}
}

// RAVEN_SIGNING_SECRET: one secret or several, space-separated; a bad one is refused
// naming the setting and what is wrong, never showing the secret.
func TestSigningSecretSetting(t *testing.T) {
	t.Parallel()
	const good = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	d, err := parseDispatch(map[string]string{"RAVEN_URL": "http://raven/", "RAVEN_SIGNING_SECRET": good + " whsec_" + strings.Repeat("QUFB", 8)})
	if err != nil || len(d.Raven.Signing) != 2 {
		t.Fatalf("two secrets: %d read (%v)", len(d.Raven.Signing), err)
	}
	if d, err := parseDispatch(map[string]string{"RAVEN_URL": "http://raven/"}); err != nil || d.Raven.Signing != nil {
		t.Fatalf("unset: %v (%v), want no signing", d.Raven.Signing, err)
	}
	for _, c := range []struct{ name, secret, want string }{
		{"NoPrefix", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "begins with whsec_"},
		{"NotBase64", "whsec_MfKQ9r8GKYqrTwjUPD8I!PZIo2LaLaSw", "not standard base64"},
		{"ShortKey", "whsec_c2hvcnQta2V5", "9 bytes; it must be 24 to 64"},
		{"SecondBad", good + " whsec_c2hvcnQta2V5", "secret 2 of 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseDispatch(map[string]string{"RAVEN_URL": "http://raven/", "RAVEN_SIGNING_SECRET": c.secret})
			if err == nil || !strings.Contains(err.Error(), "RAVEN_SIGNING_SECRET") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one naming RAVEN_SIGNING_SECRET and saying %q", err, c.want)
			}
			for _, part := range []string{"MfKQ9r8", "c2hvcnQta2V5"} {
				if strings.Contains(err.Error(), part) {
					t.Fatalf("the error shows the secret: %v", err)
				}
			}
		})
	}
}

// SafeURL, which the dispatcher's start-up lines show raven's URL by, keeps the scheme,
// host and path, and drops the user, password, query and fragment; where the host cannot
// be told apart from a password, it shows the scheme alone.
func TestSafeURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://svcuser:pa55word@raven.example:8443/hook?api_key=SECRET#x": "https://raven.example:8443/hook",
		"https://raven.example/hook?fields=a,b":                             "https://raven.example/hook",
		"http://svcuser:1234#pa55word@raven.example/hook":                   "http://(the rest hidden: it cannot be read as a URL)",
		"http://svcuser:pa55%zz@raven.example/":                             "http://(the rest hidden: it cannot be read as a URL)",
		"svcuser:pa55word@raven.example":                                    "(a URL that cannot be read, hidden)",
	} {
		if got := SafeURL(in); got != want {
			t.Errorf("SafeURL(%s) = %s, want %s", in, got, want)
		}
	}
}
