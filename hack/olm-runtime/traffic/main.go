// Command traffic sends one HTTP GET every interval to a URL, each on a new TCP connection
// (no keep-alive, so no client-side retry can hide a refused or reset connection), until it
// receives SIGTERM or SIGINT or -max-duration passes. A request fails unless it returns 200
// within -timeout. On exit it prints the counts, the latency percentiles and the first
// failures, and exits 0 whatever it counted: the caller judges the numbers.
//
// make olm-e2e runs it through the Gateway while OLM upgrades Coxswain.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"
)

type failure struct {
	at     time.Duration
	reason string
}

func main() {
	url := flag.String("url", "", "URL to GET")
	host := flag.String("host", "", "Host header (default: the URL's host)")
	interval := flag.Duration("interval", 20*time.Millisecond, "time between requests")
	timeout := flag.Duration("timeout", 2*time.Second, "a request slower than this fails")
	maxDuration := flag.Duration("max-duration", 15*time.Minute, "stop after this long even without a signal")
	ready := flag.String("ready-file", "", "file created once the first request succeeded")
	flag.Parse()
	if *url == "" {
		fmt.Fprintln(os.Stderr, "traffic: -url is required")
		os.Exit(2)
	}

	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *maxDuration)
	defer cancel()

	start := time.Now()
	var latencies []time.Duration
	var failures []failure
	failed := 0
	ticker := time.NewTicker(*interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			report(time.Since(start), latencies, failed, failures)
			return
		case <-ticker.C:
		}
		sent := time.Now()
		reason := get(client, *url, *host)
		if reason == "" {
			latencies = append(latencies, time.Since(sent))
			if *ready != "" && len(latencies) == 1 {
				if err := os.WriteFile(*ready, nil, 0o644); err != nil {
					fmt.Fprintf(os.Stderr, "traffic: %v\n", err)
				}
			}
			continue
		}
		failed++
		if len(failures) < 20 {
			failures = append(failures, failure{at: sent.Sub(start), reason: reason})
		}
	}
}

// get returns why the request failed, or "" for a 200.
func get(client *http.Client, url, host string) string {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	if host != "" {
		req.Host = host
	}
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "reading the body: " + err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("status %d", resp.StatusCode)
	}
	return ""
}

func report(elapsed time.Duration, latencies []time.Duration, failed int, failures []failure) {
	total := len(latencies) + failed
	fmt.Printf("traffic: %d requests in %.1fs, %d succeeded, %d failed\n",
		total, elapsed.Seconds(), len(latencies), failed)
	if len(latencies) > 0 {
		sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
		at := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
		fmt.Printf("traffic: latency p50 %v, p99 %v, max %v\n",
			at(0.5).Round(time.Microsecond), at(0.99).Round(time.Microsecond),
			latencies[len(latencies)-1].Round(time.Microsecond))
	}
	for _, f := range failures {
		fmt.Printf("traffic: failure at +%.3fs: %s\n", f.at.Seconds(), f.reason)
	}
}
