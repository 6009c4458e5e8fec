#!/bin/sh
# The entrypoint of pgfence's test image: the part of the official postgres
# image's docker-entrypoint.sh that testcontainers' postgres module relies on.
# On first start (empty PGDATA) it runs initdb with POSTGRES_USER and
# POSTGRES_PASSWORD, lets every address in with POSTGRES_HOST_AUTH_METHOD
# (default scram-sha-256), starts a
# temporary server on the socket only, creates POSTGRES_DB, runs
# /docker-entrypoint-initdb.d/*.sql and *.sh, stops it, then runs the
# command. Like the official image it therefore logs "database system is
# ready to accept connections" twice, which the module waits for.
set -eu

if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
	user="${POSTGRES_USER:-postgres}"
	db="${POSTGRES_DB:-$user}"
	pwfile="$(mktemp)"
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words
	initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" \
		--auth-local=trust --auth-host=scram-sha-256 ${POSTGRES_INITDB_ARGS:-}
	rm -f "$pwfile"
	printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	if [ "$db" != postgres ]; then
		echo 'CREATE DATABASE :"db"' |
			psql -X -q -v ON_ERROR_STOP=1 -U "$user" -d postgres -v db="$db"
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh) echo "running $f"; . "$f" ;;
		*.sql) echo "running $f"; psql -X -v ON_ERROR_STOP=1 -U "$user" -d "$db" -f "$f" ;;
		*) if [ -e "$f" ]; then echo "ignoring $f"; fi ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
