package migrations

import "context"

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
