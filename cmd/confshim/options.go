package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/confshim/confshim/internal/apisix"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

var (
	errVersion = errors.New("version requested")
	errHelp    = errors.New("help requested")
)

type options struct {
	listen, upstream, metricsListen string
	preserve                        []string
	merge                           []string
	fallback                        bool
	fallbackAnswer                  proxy.FallbackAnswer
	trustConnection                 proxy.TrustMode
	maxBodyBytes                    int64
	bodyBudgetBytes                 int64
	reseedInterval                  time.Duration
	stateDir                        string
	upstreamTimeout                 time.Duration
	shutdownTimeout                 time.Duration
	adminKey                        string
	logLevel                        zerolog.Level
	logFormat                       string
	upstreamCAFile                  string
	upstreamInsecure                bool
	upstreamClientCert              string
	upstreamClientKey               string
	tlsCertFile, tlsKeyFile         string
	allowCIDRs                      []netip.Prefix
}

// rawFlag keeps the text it was given; values are checked together after parsing so
// that every bad flag is reported at once.
type rawFlag struct {
	value  string
	isBool bool
}

func (f *rawFlag) String() string     { return f.value }
func (f *rawFlag) Set(v string) error { f.value = v; return nil }
func (f *rawFlag) IsBoolFlag() bool   { return f.isBool }

// flagSpec is one flag: its default, its help, and how its text becomes an option
// (an error is the flag's one line, without its name).
type flagSpec struct {
	name, def, usage string
	isBool           bool
	set              func(o *options, v string) error
}

var flagSpecs = []flagSpec{
	{"listen", ":9280", "address clients (ADC) connect to", false, func(o *options, v string) (err error) {
		o.listen, err = address(v)
		return err
	}},
	{"upstream", "http://127.0.0.1:9180", "APISIX Admin API base URL (http or https)", false, text(func(o *options) *string { return &o.upstream })},
	{"metrics-listen", ":9281", "address serving /metrics, /healthz, /readyz and /debug/config (never the proxied API)", false, func(o *options, v string) (err error) {
		o.metricsListen, err = address(v)
		return err
	}},
	{"preserve", strings.Join(rewrite.DefaultPreserve, ","), "comma-separated sections owned by out-of-band writers; APISIX keeps what it holds for them (empty: none)", false, func(o *options, v string) (err error) {
		o.preserve, err = sections(v)
		return err
	}},
	{"fallback", "off", "backfill: an item APISIX rejects is replaced by the copy the data plane last accepted, or left out, and the rest of the sync is applied; off: APISIX's rejection is the client's", false, func(o *options, v string) error {
		switch v {
		case "off":
		case "backfill":
			o.fallback = true
		default:
			return fmt.Errorf("%q is not off or backfill", v)
		}
		return nil
	}},
	{"fallback-answer", "rejection", "with --fallback backfill, what the client is told when items were held back: rejection (APISIX's own rejection of a held item, 400, while the rest of the sync is applied: a controller reports exactly the held items) or accepted (APISIX's answer to the corrected PUT)", false, func(o *options, v string) (err error) {
		o.fallbackAnswer, err = proxy.ParseFallbackAnswer(v)
		return err
	}},
	{"trust-connection", "auto", "when a sync may be decided without reading the data plane first: auto (only with a loopback --upstream whose answers never showed an intermediary: Via, a Server that is not APISIX's, X-Envoy-*), always (the path to APISIX is plain TCP: docker compose, a Service through kube-proxy), never (read before every decision)", false, func(o *options, v string) (err error) {
		o.trustConnection, err = proxy.ParseTrustMode(v)
		return err
	}},
	{"merge", "", "comma-separated sections shared item by item with out-of-band writers (e.g. global_rules,secrets): the client's items follow its snapshot, items it never sent are kept; a section named here leaves the default --preserve list, naming it in both is an error", false, func(o *options, v string) (err error) {
		o.merge, err = sections(v)
		return err
	}},
	{"max-body-bytes", "67108864", "largest request body accepted; larger ones get 413", false, func(o *options, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not a positive number of bytes", v)
		}
		o.maxBodyBytes = n
		return nil
	}},
	{"body-budget-bytes", "0", "request bodies buffered at once, all connections together (0: 4 × --max-body-bytes); past it a body waits up to 10s, then gets 503", false, func(o *options, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a number of bytes", v)
		}
		o.bodyBudgetBytes = n
		return nil
	}},
	{"upstream-timeout", "60s", "bound of each upstream request, and one deadline for all that a configs PUT asks APISIX once decided: state reads, the PUT, a conflict's retry, the fallback's validate calls and corrected PUTs (the probe before the body is read has its own)", false, func(o *options, v string) (err error) {
		o.upstreamTimeout, err = positiveDuration(v)
		return err
	}},
	{"shutdown-timeout", "20s", "how long SIGTERM waits for in-flight requests", false, func(o *options, v string) (err error) {
		o.shutdownTimeout, err = positiveDuration(v)
		return err
	}},
	{"admin-key", "", "key for confshim's own background requests (readiness, re-seeding); never used for, added to or replacing the key of a caller's request", false, text(func(o *options) *string { return &o.adminKey })},
	{"log-level", "info", "debug, info, warn or error", false, func(o *options, v string) error {
		lvl, err := zerolog.ParseLevel(v)
		if err != nil || v == "" {
			return fmt.Errorf("%q is not one of debug, info, warn, error", v)
		}
		o.logLevel = lvl
		return nil
	}},
	{"log-format", "json", "json, or console for humans", false, func(o *options, v string) error {
		if v != "json" && v != "console" {
			return fmt.Errorf("%q is not json or console", v)
		}
		o.logFormat = v
		return nil
	}},
	{"upstream-ca-file", "", "PEM CA bundle to verify APISIX's certificate (https upstream)", false, text(func(o *options) *string { return &o.upstreamCAFile })},
	{"upstream-insecure-skip-verify", "false", "do not verify APISIX's certificate (dangerous; logged loudly)", true, func(o *options, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not a boolean", v)
		}
		o.upstreamInsecure = b
		return nil
	}},
	{"upstream-client-cert-file", "", "client certificate for APISIX's admin_api_mtls", false, text(func(o *options) *string { return &o.upstreamClientCert })},
	{"upstream-client-key-file", "", "key of --upstream-client-cert-file", false, text(func(o *options) *string { return &o.upstreamClientKey })},
	// An allow-list never fails open: a value that is not empty but holds no usable
	// entry (",", " ", a template whose variables were unset) is an error, not "everyone".
	{"allow-cidrs", "", "comma-separated CIDRs allowed to use the Admin API through confshim, checked against the TCP peer (empty: everyone)", false, func(o *options, v string) error {
		if v == "" {
			return nil
		}
		cidrs, err := proxy.ParseCIDRs(v)
		switch {
		case err != nil:
			return err
		case len(cidrs) == 0:
			return fmt.Errorf("%q holds no CIDR or address (leave it empty to allow everyone)", v)
		}
		o.allowCIDRs = cidrs
		return nil
	}},
	{"tls-cert-file", "", "serve HTTPS with this certificate (reloaded when the file changes)", false, text(func(o *options) *string { return &o.tlsCertFile })},
	{"tls-key-file", "", "key of --tls-cert-file", false, text(func(o *options) *string { return &o.tlsKeyFile })},
	{"reseed-interval", "1s", "how often the data plane is pinged (HEAD /apisix/admin, no configuration read) to notice a restart; its configuration is looked at after a sign of one and as often as a cost budget allows (at most 0.5 % of an APISIX worker in any minute, each look's cost judged by the configuration's size before it is sent, at least once a minute, at most once per interval), and re-seeded when lost (0: never); the pings also keep the connection a sync may be decided on unread open: from " + apisix.DecideIdleLimit.String() + " (or 0) a sync more than " + apisix.DecideIdleLimit.String() + " after the last answer reads the state first", false, func(o *options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%q is not a duration such as 1s (0 turns re-seeding off)", v)
		}
		o.reseedInterval = d
		return nil
	}},
	{"state-dir", "", "directory where the kept configuration is also written (mode 0600), so that a restarted confshim re-seeds too (empty: memory only)", false, func(o *options, v string) error {
		o.stateDir = v
		if v == "" {
			return nil
		}
		if err := os.MkdirAll(v, 0o700); err != nil {
			return err
		}
		if fi, err := os.Stat(v); err != nil || !fi.IsDir() {
			return fmt.Errorf("%q is not a directory", v)
		}
		return nil
	}},
}

// text is the setter of a flag whose text is its value (checked where it is used:
// --upstream by proxy.New, the files when they are read).
func text(field func(*options) *string) func(*options, string) error {
	return func(o *options, v string) error {
		*field(o) = v
		return nil
	}
}

// envName is the environment variable that sets a flag: CONFSHIM_<FLAG>.
func envName(flagName string) string {
	return "CONFSHIM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseOptions reads flags, then CONFSHIM_* variables for flags not given; every
// invalid value is reported, one line each, naming the flag.
func parseOptions(args []string, lookupEnv func(string) (string, bool)) (*options, error) {
	values, given, err := readFlags(args, lookupEnv)
	if err != nil {
		return nil, err
	}
	o := &options{}
	var errs []error
	for _, s := range flagSpecs {
		if err := s.set(o, values[s.name]); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %v", s.name, err))
		}
	}
	errs = append(errs, o.combined(given["preserve"])...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return o, nil
}

// readFlags parses the command line, then takes CONFSHIM_* for the flags not given. It
// returns each flag's text, and which flags were named (by flag or variable).
func readFlags(args []string, lookupEnv func(string) (string, bool)) (map[string]string, map[string]bool, error) {
	fs := flag.NewFlagSet("confshim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	raw := map[string]*rawFlag{}
	for _, s := range flagSpecs {
		f := &rawFlag{value: s.def, isBool: s.isBool}
		raw[s.name] = f
		fs.Var(f, s.name, fmt.Sprintf("%s (env %s)", s.usage, envName(s.name)))
	}
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, errHelp
		}
		return nil, nil, err
	}
	if *showVersion {
		return nil, nil, errVersion
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected argument %q: confshim takes flags only", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	values := make(map[string]string, len(flagSpecs))
	for _, s := range flagSpecs {
		// a variable set to "" counts: CONFSHIM_PRESERVE= means "preserve nothing"
		if v, set := lookupEnv(envName(s.name)); !given[s.name] && set {
			raw[s.name].value = v
			given[s.name] = true
		}
		values[s.name] = raw[s.name].value
	}
	return values, given, nil
}

// combined checks what one flag alone cannot: a merged section leaves the default
// --preserve list, and naming it in both explicitly is an error; pairs go together.
func (o *options) combined(preserveNamed bool) []error {
	var errs []error
	bad := func(name, format string, a ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", name, fmt.Sprintf(format, a...)))
	}
	for _, s := range o.merge {
		if !slices.Contains(o.preserve, s) {
			continue
		}
		if preserveNamed {
			bad("merge", "%q is also named in --preserve: a section is either merged or preserved", s)
			continue
		}
		o.preserve = slices.DeleteFunc(o.preserve, func(p string) bool { return p == s }) // leaves the default list
	}
	if o.bodyBudgetBytes != 0 && o.maxBodyBytes > 0 && o.bodyBudgetBytes < o.maxBodyBytes {
		bad("body-budget-bytes", "%d is less than --max-body-bytes (%d)", o.bodyBudgetBytes, o.maxBodyBytes)
	}
	if (o.tlsCertFile == "") != (o.tlsKeyFile == "") {
		bad("tls-cert-file", "--tls-cert-file and --tls-key-file go together")
	}
	if (o.upstreamClientCert == "") != (o.upstreamClientKey == "") {
		bad("upstream-client-cert-file", "--upstream-client-cert-file and --upstream-client-key-file go together")
	}
	return errs
}

func address(v string) (string, error) {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", fmt.Errorf("%q is not a host:port address", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%q has no valid port", v)
	}
	return v, nil
}

func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration such as 60s", v)
	}
	return d, nil
}

// sections reads a section list: APISIX resource sections only, since a misspelt one
// (secretz) would silently merge or preserve nothing while the real section is left as
// it is; an empty element is said once, a repeat taken once.
func sections(v string) ([]string, error) {
	var out, unknown []string
	empty := false
	if trimmed := strings.TrimSpace(v); trimmed != "" {
		for _, s := range strings.Split(trimmed, ",") {
			switch s = strings.TrimSpace(s); {
			case s == "":
				empty = true
			case !slices.Contains(rewrite.KnownSections, s):
				unknown = append(unknown, strconv.Quote(s))
			case !slices.Contains(out, s):
				out = append(out, s)
			}
		}
	}
	var msgs []string
	if empty {
		msgs = append(msgs, fmt.Sprintf("%q has an empty section name", v))
	}
	if len(unknown) > 0 {
		what := "is not an APISIX resource section"
		if len(unknown) > 1 {
			what = "are not APISIX resource sections"
		}
		msgs = append(msgs, fmt.Sprintf("%s %s (known: %s)", strings.Join(unknown, ", "), what, strings.Join(rewrite.KnownSections, ", ")))
	}
	if len(msgs) > 0 {
		return out, errors.New(strings.Join(msgs, "; "))
	}
	return out, nil
}

// usage is the --help text; the README embeds it and a test keeps the two equal.
func usage() string {
	var b strings.Builder
	b.WriteString("Usage: confshim [flags]\n\nEvery flag can also be set with CONFSHIM_<FLAG> (upper case, - as _); the command line wins.\n\n")
	for _, s := range flagSpecs {
		def := s.def
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(&b, "  --%s (default %s)\n        %s\n", s.name, def, s.usage)
	}
	b.WriteString("  --version\n        print the version and exit\n")
	return b.String()
}
