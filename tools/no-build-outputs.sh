#!/bin/sh
# Fails when git tracks a build output: an executable that is not a script, or an
# object file (ELF, Mach-O, PE, ar archive), whatever its name.
status=0
for f in $(git ls-files); do
	[ -f "$f" ] || continue
	magic=$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46* | cffaedfe* | cefaedfe* | feedface* | feedfacf* | 4d5a* | 213c617263683e0a*)
		echo "tracked build output (object file): $f"
		status=1
		continue
		;;
	esac
	if [ -x "$f" ] && [ "$(head -c 2 "$f")" != '#!' ]; then
		echo "tracked executable that is not a script: $f"
		status=1
	fi
done
exit $status
