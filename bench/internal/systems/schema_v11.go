package systems

import _ "embed" // SchemaV11

// SchemaV11 is pgfence's schema at version 11: migrations 000001 to 000011
// as they were before the 0.1.0 baseline replaced them, kept as scenario
// 13's "before" arm. Run it in one transaction on a database whose schema
// "pgfence" exists.
//
//go:embed testdata/v11.sql
var SchemaV11 string
