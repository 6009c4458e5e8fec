package otelpgfence

import "testing"

func TestCollectionName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"accounts":             "accounts",
		"public.accounts":      "public.accounts",
		`"accounts"`:           "accounts",
		`"public"."accounts"`:  "public.accounts",
		`"we""ird"."Accounts"`: `we"ird.Accounts`,
		`"a.b"`:                "a.b",
		"":                     "",
	} {
		if got := collectionName(in); got != want {
			t.Errorf("collectionName(%q) = %q, want %q", in, got, want)
		}
	}
}
