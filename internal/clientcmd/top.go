package clientcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/charonlimit/charon/internal/offenders"
)

// Top is `charon top`: who is being limited, by which rule, from the debug
// port's GET /top of one or several replicas (their answers merged),
// refreshed until interrupted.
func Top(args []string, stdout, stderr io.Writer) error {
	fs := FlagSet("top", stderr)
	addrs := fs.String("addr", "localhost:6070", "debug port `HOST:PORT` of each replica, comma-separated (their answers are merged)")
	domain := fs.String("domain", "", "RLS domain (empty: every domain)")
	rule := fs.String("rule", "", "only this rule: file:line or its name")
	n := fs.Int("n", 5, "values shown per rule and outcome")
	interval := fs.Duration("interval", 2*time.Second, "refresh period")
	once := fs.Bool("once", false, "print once and exit")
	asJSON := fs.Bool("json", false, "print the merged answer as JSON (implies --once)")
	tokenFile := fs.String("token-file", "", "`file` of the debug port's bearer token (--debug-token-file)")
	timeout := fs.Duration("timeout", 5*time.Second, "time limit of each request")
	tlsFlags := clientTLS(fs)
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if *n < 1 || *interval <= 0 {
		return fmt.Errorf("%w: --n and --interval must be positive", ErrUsage)
	}
	cfg, err := tlsFlags.Config()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	scheme := "http"
	hc := &http.Client{Timeout: *timeout}
	if cfg != nil {
		scheme = "https"
		hc.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	var token string
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("%w: --token-file: %v", ErrUsage, err)
		}
		token = strings.TrimSpace(string(b))
	}
	q := url.Values{}
	if *domain != "" {
		q.Set("domain", *domain)
	}
	if *rule != "" {
		q.Set("rule", *rule)
	}
	replicas, err := topAddrs(*addrs)
	if err != nil {
		return err
	}
	var urls []string
	for _, a := range replicas {
		urls = append(urls, scheme+"://"+a+"/top?"+q.Encode())
	}
	fetchAll := func() (offenders.Answer, error) {
		answers := make([]offenders.Answer, len(urls))
		for i, u := range urls {
			if err := getJSON(hc, u, token, &answers[i]); err != nil {
				return offenders.Answer{}, err
			}
		}
		return MergeTop(answers...), nil
	}
	if *asJSON {
		ans, err := fetchAll()
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ans)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for {
		ans, err := fetchAll()
		if !*once {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
		}
		if err != nil {
			if *once {
				return err
			}
			fmt.Fprintln(stdout, "charon top:", err)
		} else {
			printTop(stdout, ans, len(urls), *n)
		}
		if *once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// topAddrs returns the replicas of --addr, each HOST:PORT normalised
// (host in lower case, an IP address in its canonical form, the port a
// plain number). A replica named twice would have its counts added twice
// to the merge: it is refused, naming it.
func topAddrs(list string) ([]string, error) {
	var out []string
	first := map[string]string{}
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("%w: --addr %q: want HOST:PORT (the debug port, e.g. localhost:6070)", ErrUsage, a)
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%w: --addr %q: %q is not a port number", ErrUsage, a, port)
		}
		host = strings.ToLower(host)
		if ip, err := netip.ParseAddr(host); err == nil {
			host = ip.String()
		}
		norm := net.JoinHostPort(host, strconv.FormatUint(n, 10))
		if prev, ok := first[norm]; ok {
			return nil, fmt.Errorf("%w: --addr names %s twice (%q and %q): its counts would be added twice; name each replica once", ErrUsage, norm, prev, a)
		}
		first[norm] = a
		out = append(out, norm)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --addr is empty: give the debug port of each replica, HOST:PORT,HOST:PORT", ErrUsage)
	}
	return out, nil
}

// MergeTop merges the answers of several replicas: per rule, each window's
// values are merged as sketches of disjoint streams (offenders.Merge: a
// value's count adds the floor of each replica that does not list it, so
// counts still bound the true ones from above, within the summed errors),
// and the decision rates are added step by step.
func MergeTop(answers ...offenders.Answer) offenders.Answer {
	if len(answers) == 1 {
		return answers[0]
	}
	type key struct{ domain, rule string }
	var out offenders.Answer
	var order []key
	views := map[key][]offenders.View{}
	for _, a := range answers {
		if a.At.After(out.At) {
			out.At = a.At
		}
		out.EpochSeconds, out.K = max(out.EpochSeconds, a.EpochSeconds), max(out.K, a.K)
		out.Dropped += a.Dropped
		for _, v := range a.Rules {
			k := key{v.Domain, v.Rule.Rule}
			if _, ok := views[k]; !ok {
				order = append(order, k)
			}
			views[k] = append(views[k], v)
		}
	}
	for _, k := range order {
		vs := views[k]
		m := vs[0]
		for i, w := range []*offenders.Window{&m.Rejected, &m.Granted} {
			var parts []offenders.Part
			var floor uint64
			for _, v := range vs {
				p := v.Rejected.Part()
				if i == 1 {
					p = v.Granted.Part()
				}
				parts = append(parts, p)
				floor += p.Floor
			}
			items, total := offenders.Merge(parts...)
			*w = offenders.Window{Items: items, Total: total, Floor: floor}
		}
		m.Rates = sumRates(vs)
		for _, v := range vs[1:] {
			if v.Since.Before(m.Since) {
				m.Since = v.Since
			}
		}
		out.Rules = append(out.Rules, m)
	}
	slices.SortStableFunc(out.Rules, func(a, b offenders.View) int {
		switch {
		case a.Rejected.Total > b.Rejected.Total:
			return -1
		case a.Rejected.Total < b.Rejected.Total:
			return 1
		}
		return 0
	})
	return out
}

// sumRates adds the rates of replicas, aligned on the latest end.
func sumRates(vs []offenders.View) offenders.Rates {
	var end time.Time
	for _, v := range vs {
		if v.Rates.End.After(end) {
			end = v.Rates.End
		}
	}
	r := vs[0].Rates
	n := len(r.Granted)
	out := offenders.Rates{Step: r.Step, Seconds: r.Seconds, End: end,
		Granted: make([]uint64, n), Rejected: make([]uint64, n), Shadow: make([]uint64, n)}
	if r.Seconds <= 0 {
		return out
	}
	step := time.Duration(r.Seconds) * time.Second
	for _, v := range vs {
		shift := int(end.Sub(v.Rates.End) / step)
		for i := range v.Rates.Granted {
			if j := i - shift; j >= 0 && j < n {
				out.Granted[j] += v.Rates.Granted[i]
				out.Rejected[j] += v.Rates.Rejected[i]
				out.Shadow[j] += v.Rates.Shadow[i]
			}
		}
	}
	return out
}

// lastRate is the hits per second of the last complete step of xs.
func lastRate(xs []uint64, seconds int) float64 {
	if len(xs) < 2 || seconds <= 0 {
		return 0
	}
	return float64(xs[len(xs)-2]) / float64(seconds)
}

func printTop(w io.Writer, ans offenders.Answer, replicas, n int) {
	fmt.Fprintf(w, "charon top  %s  %d replica(s)  over the last %ds to %ds  (K=%d", ans.At.Format(time.RFC3339), replicas,
		ans.EpochSeconds, 2*ans.EpochSeconds, ans.K)
	if ans.Dropped > 0 {
		fmt.Fprintf(w, ", %d untracked", ans.Dropped)
	}
	fmt.Fprintln(w, ")")
	if len(ans.Rules) == 0 {
		fmt.Fprintln(w, "\nno limited descriptor seen yet")
		return
	}
	for _, v := range ans.Rules {
		r := v.Rates
		name := v.Rule.Rule
		if v.Name != "" {
			name += " (" + v.Name + ")"
		}
		fmt.Fprintf(w, "\n%s  %s  %s\n  per second: granted %.1f  rejected %.1f  shadow %.1f\n", v.Domain, name, v.Resource,
			lastRate(r.Granted, r.Seconds), lastRate(r.Rejected, r.Seconds), lastRate(r.Shadow, r.Seconds))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, o := range []struct {
			what string
			win  offenders.Window
		}{{"rejected", v.Rejected}, {"granted", v.Granted}} {
			if o.win.Total == 0 {
				continue
			}
			fmt.Fprintf(tw, "  %s\thits\t±\tdescriptor\t(of %d)\n", strings.ToUpper(o.what), o.win.Total)
			for i, it := range o.win.Items {
				if i == n {
					break
				}
				value := it.Value
				if value == "" {
					value = "(all)"
				}
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t\n", value, it.Count, it.Err, it.Descriptor)
			}
		}
		tw.Flush()
	}
}
