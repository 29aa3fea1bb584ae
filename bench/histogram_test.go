package bench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	h := NewHistogram()
	// 1..10000 µs, once each: the q-quantile is q·10000 µs.
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	tests := []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"p50", h.Quantile(0.50), 5000 * time.Microsecond},
		{"p99", h.Quantile(0.99), 9900 * time.Microsecond},
		{"p999", h.Quantile(0.999), 9990 * time.Microsecond},
		{"max", h.Latency().Max, 10000 * time.Microsecond},
		{"mean", h.Latency().Mean, 5000500 * time.Nanosecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Three significant digits: within 0.1%.
			if rel := math.Abs(float64(tt.got-tt.want)) / float64(tt.want); rel > 0.001 {
				t.Errorf("got %v, want %v (±0.1%%), off by %.3f%%", tt.got, tt.want, 100*rel)
			}
		})
	}
	if got := h.Count(); got != 10000 {
		t.Errorf("count %d, want 10000", got)
	}
}

func TestHistogramClampsAndMerges(t *testing.T) {
	a, b := NewHistogram(), NewHistogram()
	a.Record(0)
	a.Record(-time.Second)
	b.Record(time.Hour) // above the highest trackable value
	a.Merge(b)
	l := a.Latency()
	if l.Count != 3 {
		t.Fatalf("count %d, want 3", l.Count)
	}
	if l.P50 > time.Microsecond {
		t.Errorf("p50 %v, want the floor (100ns)", l.P50)
	}
	if l.Max < 2*time.Minute-time.Second || l.Max > 2*time.Minute+time.Second {
		t.Errorf("max %v, want about the ceiling (2m)", l.Max)
	}
	if got := NewHistogram().Latency(); got != (Latency{}) {
		t.Errorf("empty histogram: %+v, want zero", got)
	}
}

func TestLatencyJSON(t *testing.T) {
	b, err := json.Marshal(Latency{Count: 2, P50: 1500 * time.Nanosecond, Max: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"count":2`, `"p50_us":1.5`, `"max_us":1000`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back Latency
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if want := (Latency{Count: 2, P50: 1500 * time.Nanosecond, Max: time.Millisecond}); back != want {
		t.Errorf("round trip: got %+v, want %+v", back, want)
	}
}

func TestFairness(t *testing.T) {
	tests := []struct {
		name string
		xs   []int64
		want float64
	}{
		{"even", []int64{5, 5, 5, 5}, 1},
		{"one takes all", []int64{8, 0, 0, 0}, 0.25},
		{"half", []int64{1, 1, 0, 0}, 0.5},
		{"uneven", []int64{1, 2, 3}, 36.0 / 42.0},
		{"single", []int64{7}, 1},
		{"none", nil, 0},
		{"zeros", []int64{0, 0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Fairness(tt.xs); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Fairness(%v) = %v, want %v", tt.xs, got, tt.want)
			}
		})
	}
}
