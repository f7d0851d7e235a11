#!/bin/sh
# The emulator with what APISIX would read from conf/config.yaml: the Admin API's
# admin_listen ip and port, and the first admin_key's key (${{VAR}} read from the
# environment, as APISIX does). Extra arguments go to the emulator (-v, --apisix-version).
conf=/usr/local/apisix/conf/config.yaml
ip=0.0.0.0 port=9180 key=${APISIX_ADMIN_KEY:-}
if [ -f "$conf" ]; then
	v=$(sed -n '/admin_listen:/,/port:/s/^ *ip: *\([^ #]*\).*/\1/p' "$conf" | head -1)
	[ -n "$v" ] && ip=$v
	v=$(sed -n '/admin_listen:/,/port:/s/^ *port: *\([0-9]*\).*/\1/p' "$conf" | head -1)
	[ -n "$v" ] && port=$v
	v=$(sed -n '/admin_key:/,$s/^ *key: *\([^ #]*\).*/\1/p' "$conf" | head -1)
	case $v in
	'' | '${{'*) ;;
	*) key=$v ;;
	esac
fi
exec /usr/local/bin/apisix-standalone --listen "$ip:$port" --admin-key "$key" "$@"
