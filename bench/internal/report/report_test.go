package report_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/report"
)

func TestTableMarkdown(t *testing.T) {
	t.Parallel()
	tb := &report.Table{Header: []string{"system", "cycles/s"}, Rows: [][]string{{"a|b", "1"}, {"c"}}}
	require.Equal(t, "| system | cycles/s |\n| --- | ---: |\n| a\\|b | 1 |\n| c |  |\n", tb.Markdown())
	tb.TextColumns = 2
	require.Contains(t, tb.Markdown(), "| --- | --- |\n")
}

func TestRatios(t *testing.T) {
	t.Parallel()
	entries := []report.Entry{
		{System: "ceiling", Value: 8000, Cells: []string{"1.0 ms"}},
		{System: "pglock", Value: 4000, Cells: []string{"2.0 ms"}},
		{System: "redislock", Value: 36000, Cells: []string{"0.4 ms"}},
		{System: "broken", Value: math.NaN()},
	}
	tb := report.Ratios("cycles/s", []string{"p50"}, entries, []string{"ceiling", "pglock", "absent"}, report.Rate)
	require.Equal(t, []string{"system", "cycles/s", "p50", "× ceiling", "× pglock"}, tb.Header)
	require.Equal(t, [][]string{
		{"ceiling", "8,000", "1.0 ms", "1.00x", "2.00x"},
		{"pglock", "4,000", "2.0 ms", "0.50x", "1.00x"},
		{"redislock", "36,000", "0.4 ms", "4.50x", "9.00x"},
		{"broken", "n/a", "", "n/a", "n/a"},
	}, tb.Rows)
}

func TestFormatters(t *testing.T) {
	t.Parallel()
	tests := []struct{ got, want string }{
		{report.Ratio(1, 3), "0.33x"},
		{report.Ratio(1, 0), "n/a"},
		{report.Ratio(0.158, 2017), "0.000078x"},
		{report.Ratio(3.1, 1000), "0.0031x"},
		{report.Ratio(12790.4, 1), "12,790x"},
		{report.Ratio(0, 5), "0.00x"},
		{report.Ratio(math.NaN(), 1), "n/a"},
		{report.Rate(7612.4), "7,612"},
		{report.Rate(math.NaN()), "n/a"},
		{report.Thousands(1234567), "1,234,567"},
		{report.Thousands(-1000), "-1,000"},
		{report.Thousands(999), "999"},
		{report.Duration(412 * time.Microsecond), "0.412 ms"},
		{report.Duration(2345 * time.Microsecond), "2.35 ms"},
		{report.Duration(12340 * time.Microsecond), "12.3 ms"},
		{report.Duration(1520 * time.Millisecond), "1520 ms"},
		{report.Duration(0), "0 ms"},
		{report.Duration(-1), "n/a"},
		{report.Bytes(512), "512 B"},
		{report.Bytes(8192), "8.0 KiB"},
		{report.Bytes(1363149), "1.3 MiB"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.got)
	}
}
