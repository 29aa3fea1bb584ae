package bench

import (
	"encoding/json"
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram bounds, in nanoseconds: values below lowest are recorded as
// lowest, values above highest as highest. Three significant digits keep
// every reported percentile within 0.1% of the true value.
const (
	histLowest  = 100                        // 100 ns
	histHighest = int64(2 * time.Minute)     // longest latency told apart
	histDigits  = 3                          // significant decimal digits
	histFloor   = time.Duration(histLowest)  // for clamping
	histCeiling = time.Duration(histHighest) // for clamping
)

// Histogram records latencies in an HDR histogram: constant memory, fixed
// relative precision. It is not safe for concurrent use; give each client
// its own and Merge them.
type Histogram struct {
	h *hdrhistogram.Histogram
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{h: hdrhistogram.New(histLowest, histHighest, histDigits)}
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	d = min(max(d, histFloor), histCeiling)
	h.h.RecordValue(int64(d)) // in range, so it cannot fail
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) { h.h.Merge(o.h) }

// Count is the number of values recorded.
func (h *Histogram) Count() int64 { return h.h.TotalCount() }

// Quantile returns the value at or below which the fraction q (0..1) of the
// values fall.
func (h *Histogram) Quantile(q float64) time.Duration {
	return time.Duration(h.h.ValueAtQuantile(q * 100))
}

// Latency summarises the histogram.
func (h *Histogram) Latency() Latency {
	if h.Count() == 0 {
		return Latency{}
	}
	return Latency{
		Count: h.Count(),
		Mean:  time.Duration(h.h.Mean()),
		P50:   h.Quantile(0.50),
		P99:   h.Quantile(0.99),
		P999:  h.Quantile(0.999),
		Max:   time.Duration(h.h.Max()),
	}
}

// Latency is a summary of a latency distribution.
type Latency struct {
	Count                     int64
	Mean, P50, P99, P999, Max time.Duration
}

// latencyJSON is Latency as JSON has it: durations in microseconds.
type latencyJSON struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_us"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
}

// MarshalJSON writes the durations as microseconds ("p50_us": 812.5).
func (l Latency) MarshalJSON() ([]byte, error) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return json.Marshal(latencyJSON{l.Count, us(l.Mean), us(l.P50), us(l.P99), us(l.P999), us(l.Max)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Latency) UnmarshalJSON(b []byte) error {
	var j latencyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d := func(us float64) time.Duration { return time.Duration(math.Round(us * float64(time.Microsecond))) }
	*l = Latency{Count: j.Count, Mean: d(j.Mean), P50: d(j.P50), P99: d(j.P99), P999: d(j.P999), Max: d(j.Max)}
	return nil
}

// Fairness is Jain's fairness index of xs: (Σx)² / (n·Σx²). It is 1 when
// every client got the same share and 1/n when one client got everything;
// 0 for no values or all zeros.
func Fairness(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		f := float64(x)
		sum += f
		sq += f * f
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}
