package chart_test

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/chart"
)

// parse checks the document is well-formed XML and returns the number of
// elements of each name.
func parse(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	counts := map[string]int{}
	d := xml.NewDecoder(strings.NewReader(string(doc)))
	for {
		tok, err := d.Token()
		if err != nil {
			require.ErrorContains(t, err, "EOF")
			return counts
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
}

func TestLineSVG(t *testing.T) {
	t.Parallel()
	c := &chart.Line{
		Title: "Throughput <uncontended> & more", XLabel: "clients", YLabel: "cycles/s",
		XLog: true, XTicks: []float64{1, 4, 16, 64},
		Series: []chart.Series{
			{Name: "ceiling", Points: []chart.Point{{1, 900}, {4, 3000}, {16, 7600}, {64, 7000}}},
			{Name: "pglock", Points: []chart.Point{{1, 500}, {4, 1800}, {16, 4600}, {64, 4000}}},
		},
	}
	doc, err := c.SVG()
	require.NoError(t, err)
	counts := parse(t, doc)
	require.Equal(t, 1, counts["svg"])
	require.Equal(t, 2, counts["polyline"])
	require.Equal(t, 8, counts["circle"])
	s := string(doc)
	require.Contains(t, s, "Throughput &lt;uncontended&gt; &amp; more")
	require.Contains(t, s, ">pglock</text>")
	for _, tick := range []string{">1</text>", ">4</text>", ">16</text>", ">64</text>", ">8k</text>"} {
		require.Contains(t, s, tick)
	}
}

func TestLineSVGLogY(t *testing.T) {
	t.Parallel()
	c := &chart.Line{
		XLog: true, YMin: 0, YMax: 1,
		Series: []chart.Series{{Name: "cdf", Points: []chart.Point{{0.3, 0.5}, {2, 0.9}, {1500, 1}}}},
	}
	doc, err := c.SVG()
	require.NoError(t, err)
	s := string(doc)
	// Decades from 0.1 to 10,000 are labelled.
	for _, tick := range []string{">0.1</text>", ">1</text>", ">10</text>", ">100</text>", ">1k</text>", ">10k</text>"} {
		require.Contains(t, s, tick)
	}
}

func TestLineSVGErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    chart.Line
		want string
	}{
		{"no data", chart.Line{Series: []chart.Series{{Name: "empty"}}}, "no data"},
		{"log zero", chart.Line{XLog: true, Series: []chart.Series{{Name: "a", Points: []chart.Point{{0, 1}}}}}, "not positive"},
		{"nan", chart.Line{Series: []chart.Series{{Name: "a", Points: []chart.Point{{1, math.NaN()}}}}}, "not finite"},
		{"log tick", chart.Line{XLog: true, XTicks: []float64{0}, Series: []chart.Series{{Name: "a", Points: []chart.Point{{1, 1}}}}}, "tick"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := tt.c.SVG()
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := (&chart.Line{}).SVG()
	require.ErrorIs(t, err, chart.ErrNoData)
}

func TestLineSVGLog2X(t *testing.T) {
	t.Parallel()
	c := &chart.Line{
		XLog2: true,
		Series: []chart.Series{
			{Name: "a", Points: []chart.Point{{1, 100}, {2, 190}, {16, 900}, {256, 700}}},
			{Name: "b", Points: []chart.Point{{3, 50}, {200, 400}}},
		},
	}
	doc, err := c.SVG()
	require.NoError(t, err)
	counts := parse(t, doc)
	require.Equal(t, 2, counts["polyline"])
	s := string(doc)
	// Every power of two from 1 to 256 is labelled, and nothing beyond:
	// the range ends at the largest point's power of two, not at a decade.
	for _, tick := range []string{">1</text>", ">2</text>", ">4</text>", ">8</text>", ">16</text>", ">32</text>", ">64</text>", ">128</text>", ">256</text>"} {
		require.Contains(t, s, tick)
	}
	require.NotContains(t, s, ">512</text>")
	require.NotContains(t, s, `y="380" text-anchor="middle">1k</text>`) // x labels sit at y=380
	// Doubling is a constant step: 16 = 2^4 sits halfway between 1 = 2^0
	// and 256 = 2^8, and so does its grid line (plot from x=78 to x=570).
	require.Contains(t, s, `<line x1="324.0" y1="40" x2="324.0"`)
	require.Contains(t, s, `<circle cx="324.0"`)

	// Explicit ticks replace the automatic ones; the range still covers them.
	c.XTicks = []float64{1, 4, 16, 64, 256, 1024}
	doc, err = c.SVG()
	require.NoError(t, err)
	s = string(doc)
	require.Contains(t, s, `y="380" text-anchor="middle">1.024k</text>`)
	require.NotContains(t, s, ">2</text>")
	// 16 = 2^4 is now 4/10 of the way across.
	require.Contains(t, s, `<circle cx="274.8"`)
}

func TestLineSVGLog2XErrors(t *testing.T) {
	t.Parallel()
	_, err := (&chart.Line{XLog2: true, Series: []chart.Series{{Name: "a", Points: []chart.Point{{0, 1}}}}}).SVG()
	require.ErrorContains(t, err, "not positive")
	_, err = (&chart.Line{XLog2: true, XTicks: []float64{-1}, Series: []chart.Series{{Name: "a", Points: []chart.Point{{1, 1}}}}}).SVG()
	require.ErrorContains(t, err, "tick")
	_, err = (&chart.Line{XLog: true, XLog2: true, Series: []chart.Series{{Name: "a", Points: []chart.Point{{1, 1}}}}}).SVG()
	require.ErrorContains(t, err, "exclusive")
}
