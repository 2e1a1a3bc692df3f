package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// chart draws the one-consumer throughput of every variant as horizontal
// bars, a panel per broker, each bar labelled with its msg/s and its ratio to
// the baseline.
func (r *routerResults) chart() string {
	var panels []int
	for gi, g := range r.groups {
		if g.consumers == 1 {
			panels = append(panels, gi)
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
	rows := 0
	for _, gi := range panels {
		rows = max(rows, len(r.groups[gi].variants))
	}
	width := padding*2 + len(panels)*panelW
	height := top + rows*(barH+gap) + 40
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="22" font-size="15" font-weight="bold">Router throughput per store, one consumer (median of %d repetitions)</text>`+"\n", padding, r.reps)
	p(`<text x="%d" y="40" fill="#555">messages/s, and ratio to no middleware in the same repetition; no-op handler</text>`+"\n", padding)
	for pi, gi := range panels {
		g := r.groups[gi]
		x0 := padding + pi*panelW
		maxRate := 0.0
		for _, v := range g.variants {
			maxRate = math.Max(maxRate, median(r.rates(gi, v)))
		}
		p(`<text x="%d" y="%d" font-weight="bold">%s (%d messages per trial)</text>`+"\n", x0, top-4, html.EscapeString(g.broker), g.n)
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
	p(`<text x="%d" y="%d" fill="#555">grey: no middleware; red: Watermill's Deduplicator; blue: the inbox middleware on each store</text>`+"\n", padding, height-12)
	p("</svg>\n")
	return b.String()
}
