package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// chart draws the one-consumer throughput of every variant as horizontal
// bars, a panel per broker, a row of panels per store round-trip time, each
// bar labelled with its msg/s and its ratio to the baseline.
func (r *routerResults) chart() string {
	var rowsOf [][]int // per store round-trip time, its groups of one consumer
	for _, rtt := range r.rtts {
		var panels []int
		for gi, g := range r.groups {
			if g.consumers == 1 && g.rtt == rtt {
				panels = append(panels, gi)
			}
		}
		if len(panels) > 0 {
			rowsOf = append(rowsOf, panels)
		}
	}
	const (
		panelW  = 460
		labelW  = 150
		barH    = 20
		gap     = 8
		top     = 74
		padding = 20
	)
	cols, heights := 0, make([]int, len(rowsOf)) // heights: bars per row of panels
	for i, panels := range rowsOf {
		cols = max(cols, len(panels))
		for _, gi := range panels {
			heights[i] = max(heights[i], len(r.groups[gi].variants))
		}
	}
	const panelTop = 34 // from a panel row's top to its first bar's
	width := padding*2 + cols*panelW
	height := top - panelTop + 40
	for _, h := range heights {
		height += panelTop + h*(barH+gap)
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="22" font-size="15" font-weight="bold">Router throughput per store, one consumer (median of %d repetitions)</text>`+"\n", padding, r.reps)
	p(`<text x="%d" y="40" fill="#555">messages/s, and ratio to no middleware in the same repetition; no-op handler</text>`+"\n", padding)
	y0 := top - panelTop // the top of the row of panels
	for ri, panels := range rowsOf {
		r.chartRow(p, panels, y0+panelTop, padding, panelW, labelW, barH, gap)
		y0 += panelTop + heights[ri]*(barH+gap)
	}
	p(`<text x="%d" y="%d" fill="#555">grey: no middleware; red: Watermill's Deduplicator; blue: the inbox middleware on each store; green: the floors</text>`+"\n", padding, height-12)
	p("</svg>\n")
	return b.String()
}

// chartRow draws the panels of one store round-trip time, whose bars start
// at top.
func (r *routerResults) chartRow(p func(string, ...any), panels []int, top, padding, panelW, labelW, barH, gap int) {
	for pi, gi := range panels {
		g := r.groups[gi]
		x0 := padding + pi*panelW
		maxRate := 0.0
		for _, v := range g.variants {
			maxRate = math.Max(maxRate, median(r.rates(gi, v)))
		}
		p(`<text x="%d" y="%d" font-weight="bold">%s%s (%d messages per trial)</text>`+"\n", x0, top-4, html.EscapeString(g.broker), html.EscapeString(distance(g.rtt)), g.n)
		barMax := float64(panelW - labelW - 110)
		for i, v := range g.variants {
			y := top + 6 + i*(barH+gap)
			rate := median(r.rates(gi, v))
			w := 0.0
			if maxRate > 0 {
				w = rate / maxRate * barMax
			}
			color := "#4e79a7"
			switch {
			case v == baseline:
				color = "#9c9c9c"
			case strings.HasPrefix(v, "deduplicator"):
				color = "#e15759"
			case strings.HasPrefix(v, "floor"):
				color = "#59a14f"
			}
			p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0+labelW-6, y+barH-6, html.EscapeString(v))
			p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0+labelW, y, w, barH, color)
			label := fmt.Sprintf("%.0f", rate)
			if v != baseline {
				label += fmt.Sprintf(" (%.2f)", median(r.ratios(gi, v)))
			}
			p(`<text x="%.1f" y="%d">%s</text>`+"\n", float64(x0+labelW)+w+4, y+barH-6, label)
		}
	}
}
