package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/trace/tracetest"
)

func samplePlot() []plotPoint {
	return []plotPoint{
		{CapMB: 1, StepMS: 61.2, StepP10: 58.0, StepP90: 70.4, Overlap: 0.62},
		{CapMB: 5, StepMS: 52.3, StepP10: 50.1, StepP90: 55.0, Overlap: 0.55},
		{CapMB: 25, StepMS: 48.9, StepP10: 47.5, StepP90: 51.7, Overlap: 0.41},
		{CapMB: 100, StepMS: 57.0, StepP10: 55.2, StepP90: 66.3, Overlap: 0.05},
	}
}

func TestPlotGolden(t *testing.T) {
	svg := plotSVG("resnet50, 2 ranks (inproc) <compute sleep & none>", samplePlot())
	checkXML(t, []byte(svg))
	golden(t, "sweep.svg", []byte(svg))
	if strings.Count(svg, "<circle") != 4 || strings.Count(svg, "<polyline") != 2 {
		t.Errorf("want 4 markers and 2 lines")
	}
	checkXML(t, []byte(plotSVG("empty", nil)))
}

func TestNiceScale(t *testing.T) {
	tests := []struct{ max, step, top float64 }{
		{70.4, 20, 80}, {4.9, 1, 5}, {0.12, 0.05, 0.15}, {1000, 200, 1000}, {0, 1, 5},
	}
	for _, tt := range tests {
		step, top := niceScale(tt.max)
		if math.Abs(step-tt.step) > 1e-9 || math.Abs(top-tt.top) > 1e-9 {
			t.Errorf("niceScale(%g) = %g, %g; want %g, %g", tt.max, step, top, tt.step, tt.top)
		}
	}
}

// checkXML fails unless data is one well-formed XML document whose root is
// an svg element.
func checkXML(t *testing.T, data []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	depth, roots := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
				if el.Name.Local != "svg" || el.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root element %v, want svg", el.Name)
				}
			}
			depth++
		case xml.EndElement:
			depth--
		}
	}
	if roots != 1 || depth != 0 {
		t.Errorf("%d root elements, depth %d at the end", roots, depth)
	}
}

// checkTrace validates a trace file and checks it has the expected ranks
// and steps.
func checkTrace(t *testing.T, path string, ranks, steps int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sum, err := tracetest.Validate(f)
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	if len(sum.Pids) != ranks {
		t.Errorf("trace has processes %v, want %d", sum.Pids, ranks)
	}
	data, _ := os.ReadFile(path)
	var doc struct {
		OtherData map[string]string `json:"otherData"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OtherData["trace_steps"] != string(rune('0'+steps)) {
		t.Errorf("otherData %v, want %d steps", doc.OtherData, steps)
	}
}

// TestPlotLegendClear checks that the legend lies outside the plot area,
// where no marker, bar or curve can be drawn, so that it hides none of
// them (it once covered the overlap curve at the smallest cap).
func TestPlotLegendClear(t *testing.T) {
	// Points at the extremes of both axes, the corners the legend could
	// sit in.
	pts := []plotPoint{
		{CapMB: 1, StepMS: 90, StepP10: 80, StepP90: 100, Overlap: 1},
		{CapMB: 100, StepMS: 10, StepP10: 5, StepP90: 100, Overlap: 0.99},
	}
	dec := xml.NewDecoder(strings.NewReader(plotSVG("t", pts)))
	inLegend := false
	var legendMaxY, dataMinY float64 = -1, math.Inf(1)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			attr := map[string]float64{}
			for _, a := range el.Attr {
				var v float64
				if _, err := fmt.Sscan(a.Value, &v); err == nil {
					attr[a.Name.Local] = v
				}
			}
			switch {
			case el.Name.Local == "g":
				inLegend = true
			case inLegend:
				legendMaxY = max(legendMaxY, attr["y"], attr["y1"], attr["y2"])
			case el.Name.Local == "circle":
				dataMinY = min(dataMinY, attr["cy"]-attr["r"])
			case el.Name.Local == "rect" && attr["width"] == 7:
				dataMinY = min(dataMinY, attr["y"])
			case el.Name.Local == "polyline":
				for _, p := range strings.Fields(attrString(el, "points")) {
					var x, y float64
					fmt.Sscanf(p, "%g,%g", &x, &y)
					dataMinY = min(dataMinY, y)
				}
			}
		case xml.EndElement:
			if el.Name.Local == "g" {
				inLegend = false
			}
		}
	}
	if legendMaxY < 0 || legendMaxY >= marginTop || dataMinY < marginTop-4 {
		t.Errorf("legend reaches y=%g, data from y=%g: want the legend above the plot area (y < %d)", legendMaxY, dataMinY, marginTop)
	}
}

func attrString(el xml.StartElement, name string) string {
	for _, a := range el.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
