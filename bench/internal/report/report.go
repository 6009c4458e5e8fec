// Package report formats benchmark results as Markdown: tables of figures,
// and ratio tables that divide each system's figure by the same figure of
// reference systems (the ceiling and the peers) measured in the same run.
package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Table is a Markdown table. The first TextColumns columns (at least one)
// are left-aligned, the others right-aligned for figures.
type Table struct {
	Header      []string
	Rows        [][]string
	TextColumns int
}

// Markdown renders the table. Cells are escaped so a "|" cannot break the
// layout; short rows are padded with empty cells.
func (t *Table) Markdown() string {
	var b strings.Builder
	cells := func(row []string) {
		b.WriteString("|")
		for i := range t.Header {
			v := ""
			if i < len(row) {
				v = strings.ReplaceAll(row[i], "|", `\|`)
			}
			b.WriteString(" " + v + " |")
		}
		b.WriteString("\n")
	}
	cells(t.Header)
	b.WriteString("|")
	for i := range t.Header {
		if i == 0 || i < t.TextColumns {
			b.WriteString(" --- |")
		} else {
			b.WriteString(" ---: |")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		cells(r)
	}
	return b.String()
}

// Entry is one system's figure in a ratio table.
type Entry struct {
	System string
	Value  float64  // the compared figure, e.g. cycles per second; NaN if missing
	Cells  []string // extra cells shown between the value and the ratios
}

// Ratios builds a table with one row per entry: the system, its value
// (formatted by format), the extra cells, then value / reference value for
// each reference system that is present among the entries. A reference
// without a usable value shows "n/a". extra names the extra cells' columns.
func Ratios(valueHeader string, extra []string, entries []Entry, refs []string, format func(float64) string) *Table {
	byName := map[string]float64{}
	for _, e := range entries {
		byName[e.System] = e.Value
	}
	var present []string
	for _, r := range refs {
		if _, ok := byName[r]; ok {
			present = append(present, r)
		}
	}
	t := &Table{Header: append(append([]string{"system", valueHeader}, extra...), prefixAll("× ", present)...)}
	for _, e := range entries {
		row := append([]string{e.System, format(e.Value)}, e.Cells...)
		for len(row) < 2+len(extra) {
			row = append(row, "")
		}
		for _, r := range present {
			row = append(row, Ratio(e.Value, byName[r]))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func prefixAll(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}

// Ratio formats a/b as "0.61x" (two significant digits below 0.1, whole
// numbers from 1,000), or "n/a" when either is missing (NaN) or b is not
// positive.
func Ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return "n/a"
	}
	r := a / b
	switch {
	case r != 0 && r < 0.1:
		digits := int(-math.Floor(math.Log10(r))) + 1
		return strconv.FormatFloat(r, 'f', digits, 64) + "x"
	case r >= 1000:
		return Thousands(int64(math.Round(r))) + "x"
	default:
		return strconv.FormatFloat(r, 'f', 2, 64) + "x"
	}
}

// Rate formats a per-second figure with thousands separators, or "n/a" for
// NaN.
func Rate(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return Thousands(int64(math.Round(v)))
}

// Thousands formats n with "," between groups of three digits.
func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Duration formats a latency in milliseconds with three significant
// digits ("0.412 ms", "12.3 ms", "1520 ms"); "n/a" for a negative value.
func Duration(d time.Duration) string {
	if d < 0 {
		return "n/a"
	}
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms == 0:
		return "0 ms"
	case ms < 1:
		return strconv.FormatFloat(ms, 'f', 3, 64) + " ms"
	case ms < 10:
		return strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
	case ms < 100:
		return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
	default:
		return strconv.FormatFloat(ms, 'f', 0, 64) + " ms"
	}
}

// Bytes formats a size in binary units ("8.0 KiB", "1.3 MiB").
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
