package digits

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

// MLP is a one-hidden-layer perceptron (Features -> Hidden, ReLU -> Classes, softmax) with all
// parameters in one flat slice, so that a gradient is one slice to AllReduce.
type MLP struct {
	Hidden int
	// Params: W1 (Hidden x Features), b1 (Hidden), W2 (Classes x Hidden), b2 (Classes).
	Params []float32
}

// NumParams is the parameter count for a hidden width.
func NumParams(hidden int) int { return hidden*Features + hidden + Classes*hidden + Classes }

// NewMLP initialises the weights (He-scaled, seeded) and zeroes the biases.
func NewMLP(hidden int, seed uint64) *MLP {
	m := &MLP{Hidden: hidden, Params: make([]float32, NumParams(hidden))}
	r := rand.New(rand.NewPCG(seed, 42))
	w1, _, w2, _ := m.split(m.Params)
	for i := range w1 {
		w1[i] = float32(r.NormFloat64() * math.Sqrt(2.0/Features))
	}
	for i := range w2 {
		w2[i] = float32(r.NormFloat64() * math.Sqrt(2.0/float64(hidden)))
	}
	return m
}

func (m *MLP) split(p []float32) (w1, b1, w2, b2 []float32) {
	h := m.Hidden
	w1 = p[:h*Features]
	b1 = p[h*Features : h*Features+h]
	w2 = p[h*Features+h : h*Features+h+Classes*h]
	b2 = p[h*Features+h+Classes*h:]
	return
}

// Gradient adds into grad the gradient of the summed cross-entropy over examples idx of d, and
// returns the summed loss and the number classified correctly.
func (m *MLP) Gradient(d Dataset, idx []int, grad []float32) (loss float64, correct int) {
	w1, b1, w2, b2 := m.split(m.Params)
	var gw1, gb1, gw2, gb2 []float32
	if grad != nil {
		gw1, gb1, gw2, gb2 = m.split(grad)
	}
	h := m.Hidden
	hid := make([]float32, h)
	dh := make([]float32, h)
	var logits, probs [Classes]float32
	for _, i := range idx {
		x := d.Row(i)
		for j := 0; j < h; j++ {
			s := b1[j]
			row := w1[j*Features : (j+1)*Features]
			for k, v := range x {
				s += row[k] * v
			}
			hid[j] = max(s, 0)
		}
		best := 0
		for c := 0; c < Classes; c++ {
			s := b2[c]
			row := w2[c*h : (c+1)*h]
			for j, v := range hid {
				s += row[j] * v
			}
			logits[c] = s
			if s > logits[best] {
				best = c
			}
		}
		y := int(d.Y[i])
		if best == y {
			correct++
		}
		var z float64
		for c := range logits {
			z += math.Exp(float64(logits[c] - logits[best]))
		}
		for c := range logits {
			probs[c] = float32(math.Exp(float64(logits[c]-logits[best])) / z)
		}
		loss += -math.Log(math.Max(float64(probs[y]), 1e-12))
		if grad == nil {
			continue
		}
		for j := range dh {
			dh[j] = 0
		}
		for c := 0; c < Classes; c++ {
			g := probs[c]
			if c == y {
				g--
			}
			gb2[c] += g
			row, grow := w2[c*h:(c+1)*h], gw2[c*h:(c+1)*h]
			for j, v := range hid {
				grow[j] += g * v
				dh[j] += g * row[j]
			}
		}
		for j := 0; j < h; j++ {
			if hid[j] <= 0 {
				continue
			}
			gb1[j] += dh[j]
			grow := gw1[j*Features : (j+1)*Features]
			for k, v := range x {
				grow[k] += dh[j] * v
			}
		}
	}
	return loss, correct
}

// Evaluate returns the mean loss and the accuracy on d.
func (m *MLP) Evaluate(d Dataset) (loss, accuracy float64) {
	idx := make([]int, d.Len())
	for i := range idx {
		idx[i] = i
	}
	l, c := m.Gradient(d, idx, nil)
	return l / float64(d.Len()), float64(c) / float64(d.Len())
}

// state is what a worker checkpoints: its step, parameters and momentum.
type state struct {
	Step     int64
	Params   []float32
	Velocity []float32
}

func (s state) marshal() []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, s.Step)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(s.Params)))
	_ = binary.Write(&b, binary.LittleEndian, s.Params)
	_ = binary.Write(&b, binary.LittleEndian, s.Velocity)
	return b.Bytes()
}

func (s *state) unmarshal(data []byte, nParams int) error {
	r := bytes.NewReader(data)
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &s.Step); err != nil {
		return fmt.Errorf("digits: checkpoint header: %w", err)
	}
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return fmt.Errorf("digits: checkpoint header: %w", err)
	}
	if int(n) != nParams {
		return fmt.Errorf("digits: checkpoint has %d parameters, the model %d", n, nParams)
	}
	s.Params, s.Velocity = make([]float32, n), make([]float32, n)
	if err := binary.Read(r, binary.LittleEndian, s.Params); err != nil {
		return fmt.Errorf("digits: checkpoint params: %w", err)
	}
	if err := binary.Read(r, binary.LittleEndian, s.Velocity); err != nil {
		return fmt.Errorf("digits: checkpoint momentum: %w", err)
	}
	if r.Len() != 0 {
		return fmt.Errorf("digits: checkpoint has %d trailing bytes", r.Len())
	}
	return nil
}
