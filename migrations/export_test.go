package migrations

import "context"

// UpTo applies the pending migrations up to version, as Up does (without
// its second-install check): tests use it to build an older install.
func UpTo(ctx context.Context, t Target, cfg *Config, version uint) error {
	return run(ctx, t, cfg, "up", func(r *runner) error {
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
