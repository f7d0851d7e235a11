package main

import (
	"errors"
	"flag"
	"fmt"
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

type flagSpec struct {
	name, def, usage string
	isBool           bool
}

var flagSpecs = []flagSpec{
	{"listen", ":9280", "address clients (ADC) connect to", false},
	{"upstream", "http://127.0.0.1:9180", "APISIX Admin API base URL (http or https)", false},
	{"metrics-listen", ":9281", "address serving /metrics, /healthz, /readyz and /debug/config (never the proxied API)", false},
	{"preserve", strings.Join(rewrite.DefaultPreserve, ","), "comma-separated sections owned by out-of-band writers; APISIX keeps what it holds for them (empty: none)", false},
	{"fallback", "off", "backfill: an item APISIX rejects is replaced by the copy the data plane last accepted, or left out, and the rest of the sync is applied; off: APISIX's rejection is the client's", false},
	{"merge", "", "comma-separated sections shared item by item with out-of-band writers (e.g. global_rules,secrets): the client's items follow its snapshot, items it never sent are kept; a section named here leaves the default --preserve list, naming it in both is an error", false},
	{"max-body-bytes", "67108864", "largest request body accepted; larger ones get 413", false},
	{"body-budget-bytes", "0", "request bodies buffered at once, all connections together (0: 4 × --max-body-bytes); past it a body waits up to 10s, then gets 503", false},
	{"upstream-timeout", "60s", "bound of each upstream request, and one deadline for all that a configs PUT asks APISIX once decided: state reads, the PUT, a conflict's retry, the fallback's validate calls and corrected PUTs (the probe before the body is read has its own)", false},
	{"shutdown-timeout", "20s", "how long SIGTERM waits for in-flight requests", false},
	{"admin-key", "", "key for confshim's own background requests (readiness, re-seeding); never used for, added to or replacing the key of a caller's request", false},
	{"log-level", "info", "debug, info, warn or error", false},
	{"log-format", "json", "json, or console for humans", false},
	{"upstream-ca-file", "", "PEM CA bundle to verify APISIX's certificate (https upstream)", false},
	{"upstream-insecure-skip-verify", "false", "do not verify APISIX's certificate (dangerous; logged loudly)", true},
	{"upstream-client-cert-file", "", "client certificate for APISIX's admin_api_mtls", false},
	{"upstream-client-key-file", "", "key of --upstream-client-cert-file", false},
	{"allow-cidrs", "", "comma-separated CIDRs allowed to use the Admin API through confshim, checked against the TCP peer (empty: everyone)", false},
	{"tls-cert-file", "", "serve HTTPS with this certificate (reloaded when the file changes)", false},
	{"tls-key-file", "", "key of --tls-cert-file", false},
	{"reseed-interval", "1s", "how often the data plane is pinged (HEAD /apisix/admin, no configuration read) to notice a restart; its configuration is looked at after a sign of one and as often as a cost budget allows (at most 0.5 % of an APISIX worker, at least once a minute, at most once per interval), and re-seeded when lost (0: never)", false},
	{"state-dir", "", "directory where the kept configuration is also written (mode 0600), so that a restarted confshim re-seeds too (empty: memory only)", false},
}

// envName is the environment variable that sets a flag: CONFSHIM_<FLAG>.
func envName(flagName string) string {
	return "CONFSHIM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseOptions reads flags, then CONFSHIM_* variables for flags not given; every
// invalid value is reported, one line each, naming the flag.
func parseOptions(args []string, lookupEnv func(string) (string, bool)) (*options, error) {
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
			return nil, errHelp
		}
		return nil, err
	}
	if *showVersion {
		return nil, errVersion
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: confshim takes flags only", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, s := range flagSpecs {
		// a variable set to "" counts: CONFSHIM_PRESERVE= means "preserve nothing"
		if v, set := lookupEnv(envName(s.name)); !given[s.name] && set {
			raw[s.name].value = v
		}
	}

	o := &options{}
	var errs []error
	bad := func(name string, format string, a ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", name, fmt.Sprintf(format, a...)))
	}
	get := func(name string) string { return raw[name].value }
	addr := func(name string) string {
		v := get(name)
		if _, port, err := net.SplitHostPort(v); err != nil {
			bad(name, "%q is not a host:port address", v)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			bad(name, "%q has no valid port", v)
		}
		return v
	}
	duration := func(name string) time.Duration {
		d, err := time.ParseDuration(get(name))
		if err != nil || d <= 0 {
			bad(name, "%q is not a positive duration such as 60s", get(name))
		}
		return d
	}
	o.listen = addr("listen")
	o.metricsListen = addr("metrics-listen")
	o.upstream = get("upstream")
	// A section list names APISIX resource sections only: a misspelt one (secretz)
	// would silently merge or preserve nothing while the real section is left as is.
	sections := func(name string) []string {
		var out, unknown []string
		empty := false
		if v := strings.TrimSpace(get(name)); v != "" {
			for _, s := range strings.Split(v, ",") {
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
		if empty {
			bad(name, "%q has an empty section name", get(name))
		}
		if len(unknown) > 0 {
			what := "is not an APISIX resource section"
			if len(unknown) > 1 {
				what = "are not APISIX resource sections"
			}
			bad(name, "%s %s (known: %s)", strings.Join(unknown, ", "), what, strings.Join(rewrite.KnownSections, ", "))
		}
		return out
	}
	switch v := get("fallback"); v {
	case "off":
	case "backfill":
		o.fallback = true
	default:
		bad("fallback", "%q is not off or backfill", v)
	}
	o.preserve, o.merge = sections("preserve"), sections("merge")
	_, preserveFromEnv := lookupEnv(envName("preserve"))
	for _, s := range o.merge {
		if !slices.Contains(o.preserve, s) {
			continue
		}
		if given["preserve"] || preserveFromEnv {
			bad("merge", "%q is also named in --preserve: a section is either merged or preserved", s)
			continue
		}
		o.preserve = slices.DeleteFunc(o.preserve, func(p string) bool { return p == s }) // leaves the default list
	}
	if n, err := strconv.ParseInt(get("max-body-bytes"), 10, 64); err != nil || n <= 0 {
		bad("max-body-bytes", "%q is not a positive number of bytes", get("max-body-bytes"))
	} else {
		o.maxBodyBytes = n
	}
	if n, err := strconv.ParseInt(get("body-budget-bytes"), 10, 64); err != nil || n < 0 {
		bad("body-budget-bytes", "%q is not a number of bytes", get("body-budget-bytes"))
	} else {
		o.bodyBudgetBytes = n
		if n != 0 && o.maxBodyBytes > 0 && n < o.maxBodyBytes {
			bad("body-budget-bytes", "%d is less than --max-body-bytes (%d)", n, o.maxBodyBytes)
		}
	}
	if d, err := time.ParseDuration(get("reseed-interval")); err != nil || d < 0 {
		bad("reseed-interval", "%q is not a duration such as 1s (0 turns re-seeding off)", get("reseed-interval"))
	} else {
		o.reseedInterval = d
	}
	o.stateDir = get("state-dir")
	if o.stateDir != "" {
		if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
			bad("state-dir", "%v", err)
		} else if fi, err := os.Stat(o.stateDir); err != nil || !fi.IsDir() {
			bad("state-dir", "%q is not a directory", o.stateDir)
		}
	}
	o.upstreamTimeout = duration("upstream-timeout")
	o.shutdownTimeout = duration("shutdown-timeout")
	o.adminKey = get("admin-key")
	if lvl, err := zerolog.ParseLevel(get("log-level")); err != nil || get("log-level") == "" {
		bad("log-level", "%q is not one of debug, info, warn, error", get("log-level"))
	} else {
		o.logLevel = lvl
	}
	switch o.logFormat = get("log-format"); o.logFormat {
	case "json", "console":
	default:
		bad("log-format", "%q is not json or console", o.logFormat)
	}
	o.upstreamCAFile = get("upstream-ca-file")
	if b, err := strconv.ParseBool(get("upstream-insecure-skip-verify")); err != nil {
		bad("upstream-insecure-skip-verify", "%q is not a boolean", get("upstream-insecure-skip-verify"))
	} else {
		o.upstreamInsecure = b
	}
	o.upstreamClientCert, o.upstreamClientKey = get("upstream-client-cert-file"), get("upstream-client-key-file")
	o.tlsCertFile, o.tlsKeyFile = get("tls-cert-file"), get("tls-key-file")
	// An allow-list never fails open: a value that is not empty but holds no usable
	// entry (",", " ", a template whose variables were unset) is an error, not "everyone".
	if v := get("allow-cidrs"); v != "" {
		if cidrs, err := proxy.ParseCIDRs(v); err != nil {
			bad("allow-cidrs", "%v", err)
		} else if len(cidrs) == 0 {
			bad("allow-cidrs", "%q holds no CIDR or address (leave it empty to allow everyone)", v)
		} else {
			o.allowCIDRs = cidrs
		}
	}
	if (o.tlsCertFile == "") != (o.tlsKeyFile == "") {
		bad("tls-cert-file", "--tls-cert-file and --tls-key-file go together")
	}
	if (o.upstreamClientCert == "") != (o.upstreamClientKey == "") {
		bad("upstream-client-cert-file", "--upstream-client-cert-file and --upstream-client-key-file go together")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return o, nil
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
