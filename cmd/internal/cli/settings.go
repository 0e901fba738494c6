// Package cli holds what the binaries share: settings read from flags and environment
// variables, logging, and the wiring of the service's packages. It is the only code
// besides main that reads configuration.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// Settings is a set of settings, each a flag and an environment variable of the same
// name (NATS_URL is -nats-url). A flag given on the command line wins over the variable.
type Settings struct {
	fs     *flag.FlagSet
	getenv func(string) string
	specs  []*spec
	after  []func()
	given  map[string]bool // the settings given, by variable name, once parsed
}

type spec struct {
	env, flag, accepts string
	check              func(string) error
	redact             func(string) string // how the value appears in errors; nil: as it is
}

// NewSettings returns an empty set for the program name, reading variables with getenv.
func NewSettings(name string, getenv func(string) string, usageOut io.Writer) *Settings {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usageOut)
	s := &Settings{fs: fs, getenv: getenv}
	fs.Usage = func() {
		fmt.Fprintf(usageOut, "Usage of %s (every flag can also be set by the environment variable shown):\n", name)
		fs.PrintDefaults()
	}
	return s
}

func flagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

func (s *Settings) add(env, usage, accepts string, v flag.Value, check func(string) error) {
	sp := &spec{env: env, flag: flagName(env), accepts: accepts, check: check}
	s.specs = append(s.specs, sp)
	s.fs.Var(v, sp.flag, fmt.Sprintf("%s [%s]", usage, env))
}

// Parse reads args, then the environment for every setting the args did not give, and
// checks each value. An error names the setting and says what it accepts.
func (s *Settings) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; every setting is a -flag or an environment variable", s.fs.Args())
	}
	return s.resolve()
}

// ParseWithArgs is Parse for a command that takes arguments after its flags; it returns
// them, between min and max of them.
func (s *Settings) ParseWithArgs(args []string, min, max int, what string) ([]string, error) {
	if err := s.fs.Parse(args); err != nil {
		return nil, err
	}
	if n := s.fs.NArg(); n < min || n > max {
		return nil, fmt.Errorf("%s: expected %s, got %d argument(s) %q (flags go before arguments)", s.fs.Name(), what, n, s.fs.Args())
	}
	return s.fs.Args(), s.resolve()
}

// Given says whether the setting named by its variable (INGEST_ADDR) was given, as a
// flag or a non-empty variable, rather than left at its default: for a default that
// depends on another setting (the standalone's listeners bind loopback unless told
// otherwise). False before Parse.
func (s *Settings) Given(env string) bool { return s.given[env] }

// Flags is the flag set, for a command's own flags that have no environment variable.
func (s *Settings) Flags() *flag.FlagSet { return s.fs }

// SetUsage replaces the usage text's heading.
func (s *Settings) SetUsage(out io.Writer, heading string) {
	s.fs.Usage = func() {
		fmt.Fprintln(out, heading)
		fmt.Fprintln(out, "\nFlags (those showing [NAME] can also be set by that environment variable):")
		s.fs.PrintDefaults()
	}
}

func (s *Settings) resolve() error {
	onCommandLine := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	s.given = map[string]bool{}
	var errs []error
	for _, sp := range s.specs {
		source := "-" + sp.flag
		if !onCommandLine[sp.flag] {
			v, ok := lookup(s.getenv, sp.env)
			if !ok {
				continue
			}
			source = sp.env
			if err := s.fs.Set(sp.flag, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not valid: it accepts %s", source, sp.shown(v), sp.accepts))
				continue
			}
		}
		s.given[sp.env] = true
		if sp.check != nil {
			val := s.fs.Lookup(sp.flag).Value.String()
			if err := sp.check(val); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not valid (%v): it accepts %s", source, sp.shown(val), err, sp.accepts))
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, f := range s.after {
		f()
	}
	return nil
}

func (sp *spec) shown(v string) string {
	if sp.redact == nil {
		return v
	}
	return sp.redact(v)
}

// afterParse runs f once every value is read, to copy values into their final types.
func (s *Settings) afterParse(f func()) { s.after = append(s.after, f) }

func lookup(getenv func(string) string, env string) (string, bool) {
	v := getenv(env)
	return v, v != ""
}

// String registers a string setting.
func (s *Settings) String(p *string, env, def, usage string) {
	*p = def
	s.add(env, usage, "any text", (*stringValue)(p), nil)
}

// URL registers a setting that holds one URL of one of the schemes, taken whole: a
// comma in its query is part of it. Its errors show the URL's scheme, host and path,
// never its user, password or query (SafeURL).
func (s *Settings) URL(p *string, env, def, usage string, schemes ...string) {
	*p = def
	accepts := fmt.Sprintf("one %s URL", strings.Join(schemes, "/"))
	s.add(env, usage, accepts, (*stringValue)(p), func(v string) error {
		if v == "" {
			return nil
		}
		return checkURL(v, schemes)
	})
	s.specs[len(s.specs)-1].redact = SafeURL
}

// URLs registers a setting that holds one URL or a comma-separated list of them (a
// cluster's servers). Its errors show each URL's scheme, host and path only.
func (s *Settings) URLs(p *string, env, def, usage string, schemes ...string) {
	*p = def
	accepts := fmt.Sprintf("a comma-separated list of %s URLs", strings.Join(schemes, "/"))
	s.add(env, usage, accepts, (*stringValue)(p), func(v string) error {
		if v == "" {
			return nil
		}
		for _, one := range strings.Split(v, ",") {
			if err := checkURL(strings.TrimSpace(one), schemes); err != nil {
				return fmt.Errorf("%s: %w", SafeURL(one), err)
			}
		}
		return nil
	})
	s.specs[len(s.specs)-1].redact = func(v string) string {
		parts := strings.Split(v, ",")
		for i, one := range parts {
			parts[i] = SafeURL(one)
		}
		return strings.Join(parts, ",")
	}
}

// checkURL says what is wrong with v as a URL of one of the schemes, in words that do
// not repeat any part of it.
func checkURL(v string, schemes []string) error {
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return errors.New("it cannot be read as a URL (a character such as @, #, % or / in a password must be URL-escaped)")
	case !slices.Contains(schemes, u.Scheme):
		return fmt.Errorf("its scheme must be %s", strings.Join(schemes, " or "))
	case u.Host == "":
		return errors.New("it has no host")
	case strings.Contains(v, "#"):
		return errors.New("it has a fragment (#...), which is never sent: a # in a password must be URL-escaped as %23")
	}
	return nil
}

// HeaderNames registers a setting that holds a comma-separated list of HTTP header
// names, or the word none (an empty variable is one not set).
func (s *Settings) HeaderNames(p *[]string, env, def, usage string) {
	raw := new(string)
	*raw = def
	s.add(env, usage, "a comma-separated list of HTTP header names, or none", (*stringValue)(raw), func(v string) error {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); strings.EqualFold(name, "none") && strings.TrimSpace(v) != name {
				return errors.New("none stands alone: it means no headers")
			}
		}
		for _, name := range splitList(v) {
			if !headerName(name) {
				return fmt.Errorf("%q is not a header name", name)
			}
		}
		return nil
	})
	*p = splitList(def)
	s.afterParse(func() { *p = splitList(*raw) })
}

func splitList(v string) []string {
	if strings.TrimSpace(v) == "none" {
		return nil
	}
	var out []string
	for _, one := range strings.Split(v, ",") {
		if one = strings.TrimSpace(one); one != "" {
			out = append(out, one)
		}
	}
	return out
}

// headerName says whether v is an HTTP header name (RFC 9110's token).
func headerName(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// Secret registers a string setting whose value never appears in messages.
func (s *Settings) Secret(p *string, env, usage string) {
	s.add(env, usage, "any text", (*stringValue)(p), nil)
	s.specs[len(s.specs)-1].redact = func(string) string { return "(hidden)" }
}

// MinTokenLength is the fewest characters a bearer token given in a setting may have:
// 32, 128 bits written in hex, too many to guess by trying.
const MinTokenLength = 32

// Token registers a secret setting that holds a bearer token, or when several a
// comma-separated list of them: each at least MinTokenLength characters long.
func (s *Settings) Token(p *string, env, usage string, several bool) {
	accepts := fmt.Sprintf("a token of at least %d characters; make one with: openssl rand -hex 32", MinTokenLength)
	if several {
		accepts = fmt.Sprintf("tokens of at least %d characters each, comma-separated; make one with: openssl rand -hex 32", MinTokenLength)
	}
	s.Secret(p, env, usage)
	s.specs[len(s.specs)-1].accepts = accepts
	s.specs[len(s.specs)-1].check = func(v string) error {
		tokens := []string{v}
		if several {
			tokens = strings.Split(v, ",")
		}
		for i, t := range tokens {
			if n := utf8.RuneCountInString(strings.TrimSpace(t)); n > 0 && n < MinTokenLength {
				return fmt.Errorf("%s %d characters long: too short to resist guessing", map[bool]string{false: "the token is", true: fmt.Sprintf("token %d is", i+1)}[several], n)
			}
		}
		return nil
	}
}

// OneOf registers a setting that takes one of a few words.
func (s *Settings) OneOf(p *string, env, def, usage string, words ...string) {
	*p = def
	s.add(env, usage, "one of "+strings.Join(words, ", "), (*stringValue)(p), func(v string) error {
		if !slices.Contains(words, v) {
			return errors.New("unknown value")
		}
		return nil
	})
}

// Duration registers a duration setting of at least min.
func (s *Settings) Duration(p *time.Duration, env string, def, min time.Duration, usage string) {
	*p = def
	accepts := fmt.Sprintf("a duration of at least %s, such as %s", min, def)
	s.add(env, usage, accepts, (*durationValue)(p), func(string) error {
		if *p < min {
			return errors.New("too short")
		}
		return nil
	})
}

// Int registers an integer setting between min and max.
func (s *Settings) Int(p *int64, env string, def, min, max int64, usage string) {
	*p = def
	accepts := fmt.Sprintf("a whole number from %d to %d", min, max)
	s.add(env, usage, accepts, (*intValue)(p), func(string) error {
		if *p < min || *p > max {
			return errors.New("out of range")
		}
		return nil
	})
}

// Float registers a number setting between min and max.
func (s *Settings) Float(p *float64, env string, def, min, max float64, usage string) {
	*p = def
	accepts := fmt.Sprintf("a number from %v to %v", min, max)
	s.add(env, usage, accepts, (*floatValue)(p), func(string) error {
		if !(*p >= min && *p <= max) {
			return errors.New("out of range")
		}
		return nil
	})
}

// Bool registers an on/off setting.
func (s *Settings) Bool(p *bool, env string, usage string) {
	s.add(env, usage, "true or false", (*boolValue)(p), nil)
}

// SigningSecrets registers a setting that holds Standard Webhooks signing secrets
// (whsec_ and the key in base64), space-separated while one is rotated. As with Secret,
// its value never appears in messages.
func (s *Settings) SigningSecrets(p *[]webhook.Secret, env, usage string) {
	raw := new(string)
	s.add(env, usage, fmt.Sprintf("%s followed by a key of %d to %d bytes in standard base64 (%s$(openssl rand -base64 32)), or several such, space-separated",
		webhook.SecretPrefix, webhook.MinKeyBytes, webhook.MaxKeyBytes, webhook.SecretPrefix), (*stringValue)(raw), func(v string) error {
		_, err := webhook.ParseSecrets(v)
		return err
	})
	s.specs[len(s.specs)-1].redact = func(string) string { return "(hidden)" }
	s.afterParse(func() { *p, _ = webhook.ParseSecrets(*raw) })
}

type stringValue string

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }

type durationValue time.Duration

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	*v = durationValue(d)
	return err
}
func (v *durationValue) String() string { return time.Duration(*v).String() }

type floatValue float64

func (v *floatValue) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	*v = floatValue(f)
	return err
}
func (v *floatValue) String() string { return strconv.FormatFloat(float64(*v), 'g', -1, 64) }

type intValue int64

func (v *intValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	*v = intValue(n)
	return err
}
func (v *intValue) String() string { return strconv.FormatInt(int64(*v), 10) }

type boolValue bool

func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	*v = boolValue(b)
	return err
}
func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
