package emulator

import (
	"fmt"
	"math"
	"regexp"
	"strings"
)

// The checkers below are a small, honest subset of APISIX's Admin-API checkers: enough
// to produce each message family of the spec's §4 (schema type errors, unknown plugins,
// unknown properties, chash keys, secret and credential ids, duplicates), not a copy of
// every JSON schema.

// checkError is one checker failure; schema marks messages APISIX 3.13 prints without
// the "invalid configuration: " prefix.
type checkError struct {
	msg    string
	schema bool
}

func schemaErr(format string, args ...any) *checkError {
	return &checkError{msg: "invalid configuration: " + fmt.Sprintf(format, args...), schema: true}
}

var knownPlugins = setOf(
	"api-breaker", "authz-keycloak", "basic-auth", "batch-requests", "body-transformer",
	"cors", "csrf", "datadog", "echo", "error-log-logger", "ext-plugin-post-req",
	"ext-plugin-pre-req", "fault-injection", "file-logger", "forward-auth", "grpc-transcode",
	"grpc-web", "gzip", "hmac-auth", "http-logger", "ip-restriction", "jwt-auth",
	"kafka-logger", "key-auth", "ldap-auth", "limit-conn", "limit-count", "limit-req",
	"loki-logger", "mocking", "node-status", "opa", "openid-connect", "opentelemetry",
	"prometheus", "proxy-cache", "proxy-control", "proxy-mirror", "proxy-rewrite",
	"real-ip", "redirect", "referer-restriction", "request-id", "request-validation",
	"response-rewrite", "rocketmq-logger", "server-info", "serverless-post-function",
	"serverless-pre-function", "skywalking", "skywalking-logger", "sls-logger",
	"splunk-hec-logging", "syslog", "tcp-logger", "traffic-split", "ua-restriction",
	"udp-logger", "uri-blocker", "wolf-rbac", "workflow", "zipkin", "ai-proxy",
	"ai-prompt-template", "consumer-restriction", "multi-auth", "attach-consumer-label",
)

var (
	hashKeyPattern    = `^((uri|server_name|server_addr|request_uri|remote_port|remote_addr|query_string|host|hostname|mqtt_client_id)|arg_[0-9a-zA-z_-]+)$`
	hashKeyRe         = regexp.MustCompile(hashKeyPattern)
	credentialIDRe    = regexp.MustCompile(`^[a-zA-Z0-9-_]+/credentials/[a-zA-Z0-9-_.]+$`)
	usernameRe        = regexp.MustCompile(`^[a-zA-Z0-9_\-]+$`)
	upstreamTypes     = setOf("roundrobin", "chash", "ewma", "least_conn")
	upstreamKnownKeys = setOf("id", "name", "desc", "labels", "type", "nodes", "scheme", "retries",
		"retry_timeout", "timeout", "hash_on", "key", "pass_host", "upstream_host", "checks",
		"keepalive_pool", "tls", "discovery_type", "service_name", "discovery_args",
		"create_time", "update_time", "modifiedIndex")
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func luaType(v any) string {
	switch v.(type) {
	case float64:
		return "number"
	case string:
		return "string"
	case bool:
		return "boolean"
	case luaNull:
		return "userdata"
	}
	return "table"
}

// jsonSchemaType names a value the way APISIX's jsonschema messages do.
func jsonSchemaType(v any) string {
	switch v.(type) {
	case float64:
		return "number"
	case string:
		return "string"
	case bool:
		return "boolean"
	case luaNull:
		return "null"
	case []any:
		return "array"
	}
	return "object"
}

func checkPlugins(item table) *checkError {
	raw, ok := item["plugins"]
	if !ok {
		return nil
	}
	plugins, ok := raw.(table)
	if !ok {
		return schemaErr(`property "plugins" validation failed: wrong type: expected object, got %s`, jsonSchemaType(raw))
	}
	for _, name := range sortedKeys(plugins) {
		if !knownPlugins[name] {
			return &checkError{msg: fmt.Sprintf("unknown plugin [%s]", name)}
		}
		if err := checkPluginConf(name, plugins[name]); err != nil {
			return err
		}
	}
	return nil
}

// checkPluginConf models the two plugin checks APISIX's own tests assert (cors and
// limit-count); every other known plugin's configuration is accepted as it is.
func checkPluginConf(name string, raw any) *checkError {
	conf, _ := raw.(table)
	switch name {
	case "cors":
		if conf["allow_credential"] == true && (conf["allow_origins"] == "*" || conf["allow_origins"] == nil) {
			return &checkError{msg: "failed to check the configuration of plugin cors err: you can not set '*' for other option when 'allow_credential' is true"}
		}
	case "limit-count":
		count, ok := conf["count"].(float64)
		if !ok {
			return &checkError{msg: `failed to check the configuration of plugin limit-count err: property "count" is required`}
		}
		if count <= 0 {
			return &checkError{msg: fmt.Sprintf(`failed to check the configuration of plugin limit-count err: property "count" validation failed: expected %s to be greater than 0`, formatLuaNumber(count))}
		}
	}
	return nil
}

func checkModifiedIndex(item table) *checkError {
	if mi, ok := item["modifiedIndex"]; ok {
		if f, isNum := mi.(float64); !isNum || f != math.Trunc(f) {
			return schemaErr(`property "modifiedIndex" validation failed: wrong type: expected integer, got %s`, jsonSchemaType(mi))
		}
	}
	return nil
}

func checkUpstream(up table) *checkError {
	for _, k := range sortedKeys(up) {
		if !upstreamKnownKeys[k] {
			return schemaErr("additional properties forbidden, found %s", k)
		}
	}
	if t, ok := up["type"]; ok {
		s, isStr := t.(string)
		if !isStr || !upstreamTypes[s] {
			return schemaErr(`property "type" validation failed: matches none of the enum values`)
		}
		if s == "chash" && (up["hash_on"] == nil || up["hash_on"] == "vars") {
			key, hasKey := up["key"].(string)
			if !hasKey {
				return &checkError{msg: "missing key"}
			}
			if !hashKeyRe.MatchString(key) {
				return schemaErr("failed to match pattern %q with %q", hashKeyPattern, key)
			}
		}
	}
	return nil
}

// checkItem runs the Admin-API checker of section key on one item.
func checkItem(key string, v any) *checkError {
	item, ok := v.(table)
	if !ok {
		return schemaErr("wrong type: expected object, got %s", jsonSchemaType(v))
	}
	if key != "plugin_metadata" && key != "secrets" && key != "plugins" {
		if err := checkModifiedIndex(item); err != nil {
			return err
		}
	}
	if check, ok := checkers[key]; ok {
		return check(item)
	}
	return nil // plugins, and sections without a checker
}

// checkers are the per-section checkers of the Admin API (schema and plugin checks).
var checkers = map[string]func(table) *checkError{
	"routes":          checkRoute,
	"services":        checkWithPlugins,
	"plugin_configs":  checkWithPlugins,
	"consumer_groups": checkWithPlugins,
	"global_rules":    checkWithPlugins,
	"stream_routes":   checkWithPlugins,
	"upstreams":       checkUpstream,
	"consumers":       checkConsumer,
	"secrets":         checkSecret,
	"plugin_metadata": checkPluginMetadata,
	"ssls":            checkSSL,
}

func checkRoute(item table) *checkError {
	if uri, ok := item["uri"]; ok {
		if _, isStr := uri.(string); !isStr {
			return schemaErr(`property "uri" validation failed: wrong type: expected string, got %s`, jsonSchemaType(uri))
		}
	}
	if uris, ok := item["uris"]; ok {
		if _, isArr := uris.([]any); !isArr {
			return schemaErr(`property "uris" validation failed: wrong type: expected array, got %s`, jsonSchemaType(uris))
		}
	}
	return checkWithPlugins(item)
}

// checkWithPlugins checks an inline upstream and the plugins.
func checkWithPlugins(item table) *checkError {
	if up, ok := item["upstream"].(table); ok {
		if err := checkUpstream(up); err != nil {
			return err
		}
	}
	return checkPlugins(item)
}

func checkConsumer(item table) *checkError {
	if id, ok := item["id"].(string); ok && strings.Contains(id, "/credentials/") {
		if !credentialIDRe.MatchString(id) || len(id) < 15 || len(id) > 128 {
			return schemaErr(`property "id" validation failed: failed to match pattern "^[a-zA-Z0-9-_]+/credentials/[a-zA-Z0-9-_.]+$" with %q`, id)
		}
		return checkPlugins(item)
	}
	if u, ok := item["username"]; ok {
		s, isStr := u.(string)
		if !isStr || !usernameRe.MatchString(s) {
			return &checkError{msg: "wrong username"}
		}
	}
	return checkPlugins(item)
}

func checkSecret(item table) *checkError {
	id, _ := item["id"].(string)
	if !strings.Contains(id, "/") {
		return &checkError{msg: fmt.Sprintf("invalid secret id: %s", id)}
	}
	return nil
}

func checkPluginMetadata(item table) *checkError {
	id, ok := item["id"].(string)
	if !ok || id == "" {
		return &checkError{msg: "missing plugin name"}
	}
	if !knownPlugins[id] {
		return &checkError{msg: "invalid plugin name"}
	}
	return nil
}

func checkSSL(item table) *checkError {
	if _, ok := item["cert"]; !ok {
		if _, ok := item["certs"]; !ok {
			return schemaErr(`value should match only one of the schemas`)
		}
	}
	return nil
}

// identifier is the item's duplicate-check key; Lua compares by value, so the type is
// part of it ("1" and 1 differ).
func identifier(key string, item table) (id string, field string, ok bool) {
	if v, has := item["id"]; has {
		if key == "consumers" {
			field = "credential id"
		} else {
			field = "id"
		}
		return fmt.Sprintf("%T:%v", v, v), field, true
	}
	if key == "consumers" {
		if v, has := item["username"]; has {
			return fmt.Sprintf("%T:%v", v, v), "username", true
		}
	}
	return "", "", false
}

func displayID(item table, field string) any {
	if field == "username" {
		return item["username"]
	}
	return item["id"]
}

func sortedKeys(m table) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	return keys
}

// authKeyAttrs are the consumer auth attributes APISIX 3.18 keeps unique (§4.1.3).
var authKeyAttrs = map[string]string{
	"key-auth": "key", "basic-auth": "username", "jwt-auth": "key", "hmac-auth": "key_id",
	"ldap-auth": "user_dn", "ldap-auth-advanced": "user_dn",
}

// keyOwner is who holds an auth key among the applied consumers.
type keyOwner struct{ consumer, credential string }

// appliedKeyOwners is the applied consumers' auth keys (plugin NUL value) and who holds
// each, as APISIX 3.18's apisix/consumer.lua builds its lookup: one owner per key, the
// consumer loaded last winning. Two consumers that came to share a key (accepted once,
// before either was applied) leave the key to the later one, so a PUT refuses only the
// earlier (validate names index 0).
func appliedKeyOwners(applied table) map[string]keyOwner {
	owners := map[string]keyOwner{}
	list, _ := applied["consumers"].([]any)
	for _, raw := range list {
		other, _ := raw.(table)
		op, _ := other["plugins"].(table)
		o := keyOwner{}
		if credID, isCred := other["id"].(string); isCred {
			o.consumer, _, _ = strings.Cut(credID, "/credentials/")
			o.credential = credID
		} else {
			o.consumer, _ = other["username"].(string)
		}
		for plugin, attr := range authKeyAttrs {
			oc, _ := op[plugin].(table)
			if value, _ := oc[attr].(string); value != "" {
				owners[plugin+"\x00"+value] = o
			}
		}
	}
	return owners
}

// checkAgainstApplied runs the state-dependent checks of §4.1.3 against what the data
// plane currently holds (the caller holds e.mu, or reads a consistent snapshot).
func (e *Emulator) checkAgainstApplied(key string, item table) *checkError {
	switch {
	case key == "global_rules" && e.minor >= 17:
		plugins, _ := item["plugins"].(table)
		applied, _ := e.applied()["global_rules"].([]any)
		for _, name := range sortedKeys(plugins) {
			for _, raw := range applied {
				rule, _ := raw.(table)
				other, _ := rule["plugins"].(table)
				if _, uses := other[name]; uses && fmt.Sprint(rule["id"]) != fmt.Sprint(item["id"]) {
					return &checkError{msg: fmt.Sprintf("plugin '%s' already exists in global rule with id '%v'", name, rule["id"])}
				}
			}
		}
	case key == "consumers" && e.minor >= 18:
		username, isConsumer := item["username"].(string)
		if _, hasID := item["id"]; hasID || !isConsumer {
			return nil // not applied to credential items in this mode
		}
		plugins, _ := item["plugins"].(table)
		owners := appliedKeyOwners(e.applied())
		for _, plugin := range sortedKeys(plugins) {
			attr, tracked := authKeyAttrs[plugin]
			conf, _ := plugins[plugin].(table)
			value, _ := conf[attr].(string)
			if !tracked || value == "" || strings.HasPrefix(value, "$secret://") || strings.HasPrefix(value, "$env://") {
				continue
			}
			o, held := owners[plugin+"\x00"+value]
			switch {
			case !held || o.consumer == username:
			case o.credential != "":
				return &checkError{msg: fmt.Sprintf("duplicate %s of plugin %s found with credential: %s of consumer: %s", attr, plugin, o.credential, o.consumer)}
			default:
				return &checkError{msg: fmt.Sprintf("duplicate %s of plugin %s found with consumer: %s", attr, plugin, o.consumer)}
			}
		}
	}
	return nil
}
