// Package chart renders small, dependency-free SVG line charts for the
// benchmark report: throughput against clients (on a base-10 or, for
// doubling client counts, a base-2 logarithmic axis), and latency
// distributions (empirical CDFs on a logarithmic latency axis).
package chart

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Point is one data point.
type Point struct{ X, Y float64 }

// Series is one named line.
type Series struct {
	Name   string
	Points []Point
}

// Line describes a line chart.
type Line struct {
	Title  string
	XLabel string
	YLabel string
	// XLog and YLog draw the axis on a base-10 logarithmic scale; every
	// value on such an axis must be positive.
	XLog, YLog bool
	// XLog2 draws the x axis on a base-2 logarithmic scale instead (for
	// doubling client counts): every x value must be positive, the range
	// is rounded out to powers of two and, without XTicks, every power of
	// two is labelled. It excludes XLog.
	XLog2 bool
	// XTicks, when set, are the x values labelled on the axis; otherwise
	// ticks are chosen automatically.
	XTicks []float64
	// YMin and YMax fix the y range when YMax > YMin; otherwise it is
	// taken from the data (from 0 on a linear axis).
	YMin, YMax float64
	Series     []Series
}

// Chart geometry, in SVG user units.
const (
	width   = 760
	height  = 420
	marginL = 78
	marginR = 190
	marginT = 40
	marginB = 56
)

// palette is colour-blind friendly (Okabe–Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

// ErrNoData is returned when a chart has no point to draw.
var ErrNoData = errors.New("chart: no data points")

// SVG renders the chart as a standalone SVG document. It returns ErrNoData
// when no series has a point, and an error when a logarithmic axis gets a
// value that is not positive or any value is not finite.
func (c *Line) SVG() ([]byte, error) {
	xs, ys, err := c.ranges()
	if err != nil {
		return nil, err
	}
	px := func(x float64) float64 {
		return marginL + (c.xScale(x)-xs[0])/(xs[1]-xs[0])*(width-marginL-marginR)
	}
	py := func(y float64) float64 {
		return height - marginB - (scale(y, c.YLog)-ys[0])/(ys[1]-ys[0])*(height-marginT-marginB)
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginL, esc(c.Title))

	// Grid and ticks.
	for _, t := range c.xTicks(xs) {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, marginT, x, height-marginB)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, height-marginB+16, esc(label(t)))
	}
	for _, t := range ticks(ys, c.YLog) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, y, width-marginR, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y+4, esc(label(t)))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n",
		marginL, marginT, width-marginL-marginR, height-marginT-marginB)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (marginL+width-marginR)/2, height-14, esc(c.XLabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n",
		(marginT+height-marginB)/2, (marginT+height-marginB)/2, esc(c.YLabel))

	// Series and legend.
	for i, s := range c.Series {
		colour := palette[i%len(palette)]
		if len(s.Points) > 0 {
			var pts []string
			for _, p := range s.Points {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.X), py(p.Y)))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colour, strings.Join(pts, " "))
			if len(s.Points) <= 12 {
				for _, p := range s.Points {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p.X), py(p.Y), colour)
				}
			}
		}
		ly := marginT + 10 + i*20
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", width-marginR+12, ly, width-marginR+32, ly, colour)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-marginR+38, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String()), nil
}

// ranges returns the scaled [min, max] of both axes.
func (c *Line) ranges() (xs, ys [2]float64, err error) {
	if c.XLog && c.XLog2 {
		return xs, ys, errors.New("chart: XLog and XLog2 are exclusive")
	}
	xlog := c.XLog || c.XLog2
	first := true
	for _, s := range c.Series {
		for _, p := range s.Points {
			if math.IsNaN(p.X) || math.IsInf(p.X, 0) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
				return xs, ys, fmt.Errorf("chart: series %q: value is not finite", s.Name)
			}
			if (xlog && p.X <= 0) || (c.YLog && p.Y <= 0) {
				return xs, ys, fmt.Errorf("chart: series %q: value %v,%v is not positive on a logarithmic axis", s.Name, p.X, p.Y)
			}
			x, y := c.xScale(p.X), scale(p.Y, c.YLog)
			if first {
				xs, ys, first = [2]float64{x, x}, [2]float64{y, y}, false
				continue
			}
			xs = [2]float64{math.Min(xs[0], x), math.Max(xs[1], x)}
			ys = [2]float64{math.Min(ys[0], y), math.Max(ys[1], y)}
		}
	}
	if first {
		return xs, ys, ErrNoData
	}
	for _, t := range c.XTicks {
		if xlog && t <= 0 {
			return xs, ys, fmt.Errorf("chart: tick %v is not positive on a logarithmic axis", t)
		}
		xs = [2]float64{math.Min(xs[0], c.xScale(t)), math.Max(xs[1], c.xScale(t))}
	}
	if c.YMax > c.YMin {
		if c.YLog && c.YMin <= 0 {
			return xs, ys, errors.New("chart: YMin is not positive on a logarithmic axis")
		}
		ys = [2]float64{scale(c.YMin, c.YLog), scale(c.YMax, c.YLog)}
	} else if !c.YLog {
		ys[0] = math.Min(0, ys[0])
		ys[1] = niceCeil(ys[1])
	}
	if xlog {
		xs = [2]float64{math.Floor(xs[0] + 1e-9), math.Ceil(xs[1] - 1e-9)}
	}
	if c.YLog {
		ys = [2]float64{math.Floor(ys[0]), math.Ceil(ys[1])}
	}
	if xs[1] == xs[0] {
		xs[1] = xs[0] + 1
	}
	if ys[1] == ys[0] {
		ys[1] = ys[0] + 1
	}
	return xs, ys, nil
}

func scale(v float64, log bool) float64 {
	if log {
		return math.Log10(v)
	}
	return v
}

// xScale maps an x value to the axis' scale: log2, log10 or linear.
func (c *Line) xScale(v float64) float64 {
	if c.XLog2 {
		return math.Log2(v)
	}
	return scale(v, c.XLog)
}

func (c *Line) xTicks(xs [2]float64) []float64 {
	if len(c.XTicks) > 0 {
		return c.XTicks
	}
	if c.XLog2 {
		var out []float64
		for e := math.Ceil(xs[0] - 1e-9); e <= xs[1]+1e-9; e++ {
			out = append(out, math.Exp2(e))
		}
		return out
	}
	return ticks(xs, c.XLog)
}

// ticks returns tick values (unscaled) for a scaled range: powers of ten on
// a log axis, about five round steps on a linear one.
func ticks(r [2]float64, log bool) []float64 {
	var out []float64
	if log {
		for e := math.Ceil(r[0] - 1e-9); e <= r[1]+1e-9; e++ {
			out = append(out, math.Pow(10, e))
		}
		return out
	}
	step := niceStep((r[1] - r[0]) / 5)
	for v := math.Ceil(r[0]/step) * step; v <= r[1]+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds v up to a multiple of a round step so the top tick is
// labelled.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	step := niceStep(v / 5)
	return math.Ceil(v/step) * step
}

// label formats a tick value compactly: 1500 -> "1.5k", 0.001 -> "0.001".
func label(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}

// esc escapes text for an SVG text node.
func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
