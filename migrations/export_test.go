package migrations

import "context"

// UpTo applies the pending migrations up to version, as Up does (without
// its fast path and its second-install and owner checks): tests use it to
// build an older install.
func UpTo(ctx context.Context, t Target, cfg *Config, version uint) error {
	return run(ctx, t, cfg, "up", func(r *runner) error {
		if err := r.lock(); err != nil {
			return err
		}
		if err := r.createSchema(); err != nil {
			return err
		}
		if err := r.setSearchPath(); err != nil {
			return err
		}
		if err := r.ensureTable(); err != nil {
			return err
		}
		return r.upTo(version)
	})
}

// DownTo reverts the applied migrations newer than version, as Down does.
func DownTo(ctx context.Context, t Target, cfg *Config, version uint) error {
	return run(ctx, t, cfg, "down", func(r *runner) error {
		if err := r.setSearchPath(); err != nil {
			return err
		}
		return r.down(version)
	})
}

// UpWithoutOwnerCheck is Up without the checks of who owns the schema, its
// objects and the install: the negative control of the tests of those
// checks.
func UpWithoutOwnerCheck(ctx context.Context, t Target, cfg *Config) error {
	return up(ctx, t, cfg, &testHooks{skipOwnerCheck: true})
}

// GrantWithoutCheck is Grant without its check of what was granted.
func GrantWithoutCheck(ctx context.Context, t Target, role string, cfg *Config, opts *GrantOpts) error {
	return grant(ctx, t, role, cfg, opts, &testHooks{skipGrantCheck: true})
}

// GrantSQLAt is GrantSQL for the install at migration version.
func GrantSQLAt(schema, role string, version uint, opts *GrantOpts) []string {
	stmts, _ := grants(schema, role, version, opts)
	return stmts
}
