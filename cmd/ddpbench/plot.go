package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// plotPoint is one bucket cap of a sweep.
type plotPoint struct {
	CapMB                    float64
	StepMS, StepP10, StepP90 float64
	Overlap                  float64 // 0..1
}

// Plot geometry, in SVG user units.
const (
	plotW, plotH                              = 720, 420
	marginL, marginR, marginTop, marginBottom = 70, 70, 64, 60
	// legendY is the baseline of the legend, in the top margin between
	// the title and the plot area, where no data can be drawn under it.
	legendY = 46
)

// plotSVG draws median step time (with p10-p90 bars, left axis) and the
// overlap ratio (right axis, 0..1) against the bucket cap on a log axis.
// The output depends only on its inputs.
func plotSVG(title string, pts []plotPoint) string {
	b := &strings.Builder{}
	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="22" text-anchor="middle" font-size="14">%s</text>`+"\n", plotW/2, html.EscapeString(title))
	x0, x1 := float64(marginL), float64(plotW-marginR)
	y0, y1 := float64(plotH-marginBottom), float64(marginTop) // bottom, top
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n",
		marginL, marginTop, plotW-marginL-marginR, plotH-marginTop-marginBottom)
	if len(pts) == 0 {
		fmt.Fprintf(b, "</svg>\n")
		return b.String()
	}

	// x: log10 of the cap, padded by a quarter decade on both sides.
	lo, hi := math.Log10(pts[0].CapMB), math.Log10(pts[0].CapMB)
	ymax := 0.0
	for _, p := range pts {
		lo, hi = min(lo, math.Log10(p.CapMB)), max(hi, math.Log10(p.CapMB))
		ymax = max(ymax, p.StepP90, p.StepMS)
	}
	lo, hi = lo-0.25, hi+0.25
	xs := func(capMB float64) float64 { return x0 + (math.Log10(capMB)-lo)/(hi-lo)*(x1-x0) }
	step, top := niceScale(ymax)
	ys := func(ms float64) float64 { return y0 - ms/top*(y0-y1) }
	yo := func(r float64) float64 { return y0 - r*(y0-y1) }

	// Grid and axes.
	for v := 0.0; v <= top+step/2; v += step {
		y := ys(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#1f5fa8">%s</text>`+"\n", x0-6, y+4, trimFloat(v))
	}
	for i := 0; i <= 4; i++ {
		r := float64(i) / 4
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="start" fill="#c0501f">%.2f</text>`+"\n", x1+6, yo(r)+4, r)
	}
	for _, p := range pts {
		x := xs(p.CapMB)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444"/>`+"\n", x, y0, x, y0+5)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y0+18, trimFloat(p.CapMB))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">bucket cap (MiB, log scale)</text>`+"\n", (x0+x1)/2, plotH-18)
	fmt.Fprintf(b, `<text transform="translate(20 %.1f) rotate(-90)" text-anchor="middle" fill="#1f5fa8">step time (ms): median, p10-p90</text>`+"\n", (y0+y1)/2)
	fmt.Fprintf(b, `<text transform="translate(%d %.1f) rotate(90)" text-anchor="middle" fill="#c0501f">overlap ratio</text>`+"\n", plotW-20, (y0+y1)/2)

	// Step time: p10-p90 bars, median line and markers.
	var line, ovl []string
	type xy struct{ x, y float64 }
	stepAt, ovlAt := make([]xy, len(pts)), make([]xy, len(pts))
	for i, p := range pts {
		x := xs(p.CapMB)
		stepAt[i], ovlAt[i] = xy{x, ys(p.StepMS)}, xy{x, yo(min(max(p.Overlap, 0), 1))}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#1f5fa8" stroke-width="1.5"/>`+"\n", x, ys(p.StepP10), x, ys(p.StepP90))
		line = append(line, fmt.Sprintf("%.1f,%.1f", stepAt[i].x, stepAt[i].y))
		ovl = append(ovl, fmt.Sprintf("%.1f,%.1f", ovlAt[i].x, ovlAt[i].y))
	}
	fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="#1f5fa8" stroke-width="2"/>`+"\n", strings.Join(line, " "))
	fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="#c0501f" stroke-width="2" stroke-dasharray="6 4"/>`+"\n", strings.Join(ovl, " "))
	for i := range pts {
		sx, sy, ox, oy := stepAt[i].x, stepAt[i].y, ovlAt[i].x, ovlAt[i].y
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="#1f5fa8"><title>%s MiB: %.2f ms</title></circle>`+"\n", sx, sy, trimFloat(pts[i].CapMB), pts[i].StepMS)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="7" height="7" fill="#c0501f"><title>%s MiB: overlap %.3f</title></rect>`+"\n", ox-3.5, oy-3.5, trimFloat(pts[i].CapMB), pts[i].Overlap)
	}

	// Legend: above the plot area, so that it can hide no point.
	lx, ly := x0, float64(legendY)
	fmt.Fprintf(b, `<g id="legend">`+"\n")
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#1f5fa8" stroke-width="2"/>`+"\n", lx, ly-4, lx+24, ly-4)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f">step time (left axis)</text>`+"\n", lx+30, ly)
	lx += 200
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c0501f" stroke-width="2" stroke-dasharray="6 4"/>`+"\n", lx, ly-4, lx+24, ly-4)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f">overlap ratio (right axis)</text>`+"\n", lx+30, ly)
	fmt.Fprintf(b, "</g>\n</svg>\n")
	return b.String()
}

// niceScale returns a tick step of 1, 2 or 5 times a power of ten and the
// axis top (a multiple of it) for data up to max, with about 5 ticks.
func niceScale(max float64) (step, top float64) {
	if !(max > 0) || math.IsInf(max, 0) {
		return 1, 5
	}
	raw := max / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	return step, math.Ceil(max/step) * step
}

// trimFloat prints v with up to 3 decimals and no trailing zeros.
func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
