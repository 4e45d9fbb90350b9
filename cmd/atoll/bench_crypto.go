package main

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/pki"
)

// tlsRecord is the payload of one full TLS record (RFC 8446 5.1: 2^14 bytes), the unit
// TLS 1.3 encrypts.
const tlsRecord = 16 << 10

// newBenchCryptoCmd measures what encrypting the links between machines costs (issue
// 27, item 5): AES-GCM (the AEAD TLS 1.3 negotiates on CPUs with AES instructions, as
// crypto/tls does here) sealing one TLS record at a time on one core, and a mutual-TLS
// 1.3 stream against bare TCP over loopback, measured alternately in one run; then the
// cores that sealing alone would take at the line rate of common fabrics.
func newBenchCryptoCmd() *cobra.Command {
	var mib, rounds int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "crypto",
		Short: "AES-GCM per core and TLS against bare TCP over loopback: what encrypting links between machines costs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mib < 1 || mib > 16384 || rounds < 1 || rounds > 100 {
				return fmt.Errorf("bench crypto: --mib %d (1..16384), --rounds %d (1..100)", mib, rounds)
			}
			total := int64(mib) << 20
			gcm := map[string][]float64{}
			var tcpS, tlsS []float64
			for r := 0; r < rounds; r++ {
				for _, bits := range []int{128, 256} {
					s, err := sealRate(bits, total)
					if err != nil {
						return err
					}
					name := fmt.Sprintf("aes%d_gcm", bits)
					gcm[name] = append(gcm[name], s)
				}
				s, err := loopbackStream(total, nil)
				if err != nil {
					return fmt.Errorf("bench crypto: bare TCP: %w", err)
				}
				tcpS = append(tcpS, s)
				srv, cli, err := throwawayTLS()
				if err != nil {
					return err
				}
				if s, err = loopbackStream(total, &[2]*tls.Config{srv, cli}); err != nil {
					return fmt.Errorf("bench crypto: TLS: %w", err)
				}
				tlsS = append(tlsS, s)
			}
			gbps := func(s float64) float64 { return float64(total) / s / 1e9 }
			out := map[string]any{"bytes": total, "rounds": rounds, "record_bytes": tlsRecord}
			for name, ss := range gcm {
				out[name+"_gbps_per_core"] = gbps(percentile(ss, 0.5))
			}
			out["tcp_loopback_gbps"] = gbps(percentile(tcpS, 0.5))
			out["tls_loopback_gbps"] = gbps(percentile(tlsS, 0.5))
			out["tls_vs_tcp_ratio"] = percentile(tcpS, 0.5) / percentile(tlsS, 0.5)
			// One sealing core per aes128 rate; the receiver opens as much again.
			per := out["aes128_gcm_gbps_per_core"].(float64)
			cores := map[string]float64{}
			for _, gbit := range []int{100, 200, 400} {
				cores[fmt.Sprintf("%dgbit", gbit)] = float64(gbit) / 8 / per
			}
			out["cores_to_seal_line_rate"] = cores
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "AES-128-GCM %.2f GB/s per core, AES-256-GCM %.2f GB/s per core (%d KiB records)\n",
				per, out["aes256_gcm_gbps_per_core"], tlsRecord>>10)
			fmt.Fprintf(w, "loopback, one stream: bare TCP %.2f GB/s, mutual TLS 1.3 %.2f GB/s (ratio %.2f)\n",
				out["tcp_loopback_gbps"], out["tls_loopback_gbps"], out["tls_vs_tcp_ratio"])
			fmt.Fprintf(w, "cores to seal a link at line rate (each side; the receiver opens as much): 100 Gbit/s %.1f, 200 Gbit/s %.1f, 400 Gbit/s %.1f\n",
				cores["100gbit"], cores["200gbit"], cores["400gbit"])
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&mib, "mib", 1024, "bytes per measurement, in MiB")
	f.IntVar(&rounds, "rounds", 5, "measurements of each (the median is reported)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// sealRate seals total bytes, one TLS record at a time, with AES-GCM of the key size,
// and returns the seconds it took.
func sealRate(bits int, total int64) (float64, error) {
	key := make([]byte, bits/8)
	_, _ = rand.Read(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		return 0, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return 0, err
	}
	nonce := make([]byte, aead.NonceSize())
	msg := make([]byte, tlsRecord)
	_, _ = rand.Read(msg)
	dst := make([]byte, 0, tlsRecord+aead.Overhead())
	t := time.Now()
	for n := int64(0); n < total; n += tlsRecord {
		nonce[0]++ // a distinct nonce per record, as TLS's sequence numbers make
		if nonce[0] == 0 {
			nonce[1]++
		}
		dst = aead.Seal(dst[:0], nonce, msg, nil)
	}
	return time.Since(t).Seconds(), nil
}

// throwawayTLS makes a server and a client configuration of mutual TLS 1.3 with a
// throwaway CA, as the cluster's links use.
func throwawayTLS() (srv, cli *tls.Config, err error) {
	ca, err := pki.NewCA("bench")
	if err != nil {
		return nil, nil, err
	}
	id, err := ca.IssueIdentity("bench-peer", "127.0.0.1")
	if err != nil {
		return nil, nil, err
	}
	return id.Server(), id.Client(), nil
}

// loopbackStream sends total bytes over one loopback connection (TLS when cfg is given:
// server, client) and returns the seconds from the first byte written to the last read.
func loopbackStream(total int64, cfg *[2]*tls.Config) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	type result struct {
		s   float64
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		if cfg != nil {
			tc := tls.Server(c, cfg[0])
			if err := tc.Handshake(); err != nil {
				done <- result{err: err}
				return
			}
			c = tc
		}
		buf := make([]byte, 1<<20)
		var got int64
		var t time.Time
		for got < total {
			n, err := c.Read(buf)
			if got == 0 && n > 0 {
				t = time.Now()
			}
			got += int64(n)
			if err != nil && got < total {
				done <- result{err: err}
				return
			}
		}
		done <- result{s: time.Since(t).Seconds()}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if cfg != nil {
		tc := tls.Client(c, cfg[1])
		if err := tc.Handshake(); err != nil {
			return 0, err
		}
		c = tc
	}
	buf := make([]byte, 1<<20)
	_, _ = rand.Read(buf)
	for sent := int64(0); sent < total; {
		n, err := c.Write(buf[:min(int64(len(buf)), total-sent)])
		if err != nil {
			return 0, err
		}
		sent += int64(n)
	}
	r := <-done
	if r.err != nil && r.err != io.EOF {
		return 0, r.err
	}
	return r.s, nil
}
