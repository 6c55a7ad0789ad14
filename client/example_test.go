package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/charonlimit/charon/client"
)

// exampleClients starts an in-process server with a rate-limited resource
// api/user=alice (100 hits) and copy-limited resources db/tenant=acme (20
// copies) and gpu (8 copies), and returns n clients of it.
func exampleClients(n int) ([]*client.Client, func()) {
	f := newFake()
	f.hitsLeft["api/user=alice"] = 100
	f.copyLimit["db/tenant=acme"] = 20
	f.copyLimit["gpu"] = 8
	conn, stop, err := start(f)
	if err != nil {
		log.Fatal(err)
	}
	var cs []*client.Client
	for range n {
		cs = append(cs, client.New(conn, client.Options{FailOpen: true}))
	}
	return cs, func() {
		for _, c := range cs {
			_ = c.Close()
		}
		_ = conn.Close()
		stop()
	}
}

// Wait up to 5 seconds for a hit of a rate-limited resource (paper Figure 4).
func ExampleClient_Request() {
	cs, done := exampleClients(1)
	defer done()
	c, ctx := cs[0], context.Background()

	res, err := c.Request(ctx, client.R("api", "user", "alice"), 1, 1, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if !res.OK {
		log.Fatal("over limit")
	}
	fmt.Println("granted", res.Granted, "remaining", res.Reply.GetRemaining())
	// Output: granted 1 remaining 99
}

// Hold copies while a block runs; Close releases them however it ends (paper
// Figure 5).
func ExampleClient_Reserve() {
	cs, done := exampleClients(1)
	defer done()
	c, ctx := cs[0], context.Background()

	h, err := c.Reserve(ctx, client.R("db", "tenant", "acme"), 15, 1, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	if h.OK() {
		fmt.Println("holding", h.Copies(), "of", h.Reply().GetContext().GetDomainLimit())
	}
	// Output: holding 15 of 20
}

// Hand copies over to another process, which may be connected to another
// Charon server (paper Figure 6). The transfer id travels by any channel.
func ExampleHold_Transfer() {
	cs, done := exampleClients(2)
	defer done()
	ctx := context.Background()
	ids := make(chan string, 1) // stands for a socket between the processes
	r := client.R("db", "tenant", "acme")

	// Process 1.
	p1 := func() {
		h, err := cs[0].Reserve(ctx, r, 15, 15, 0)
		if err != nil || !h.OK() {
			log.Fatal("no copies: ", err)
		}
		defer h.Close()
		fmt.Println("p1 has", h.Copies())
		tid, err := h.Transfer(ctx, 10, 30*time.Second) // stage 10 copies
		if err != nil {
			log.Fatal(err)
		}
		ids <- tid // send to process 2
		fmt.Println("p1 has", h.Copies())
	}

	// Process 2.
	p2 := func() {
		h, err := cs[1].Seize(ctx, <-ids)
		if err != nil {
			log.Fatal(err)
		}
		defer h.Close()
		fmt.Println("p2 has", h.Copies())
		if err := h.Release(ctx, 5); err != nil { // release 5 copies
			log.Fatal(err)
		}
		fmt.Println("p2 has", h.Copies())
	}

	p1()
	p2()
	// Output:
	// p1 has 15
	// p1 has 5
	// p2 has 10
	// p2 has 5
}

// Copies of one resource and hits of a rate-limited one, pseudo-atomically
// (paper Figure 7): the rate-limited resource comes last, since its hits
// cannot be given back, and is asked for only as many as copies were
// granted, within what is left of the wait.
func Example_pseudoAtomic() {
	cs, done := exampleClients(1)
	defer done()
	c, ctx := cs[0], context.Background()
	maxWait := 2 * time.Second

	hc, err := c.Reserve(ctx, client.R("gpu"), 10, 1, maxWait)
	if err != nil {
		log.Fatal(err)
	}
	defer hc.Close()
	if !hc.OK() {
		return
	}
	n := hc.Copies() // only request as many hits as copies were granted
	rr, err := c.Request(ctx, client.R("api", "user", "alice"), n, 1, maxWait-hc.Waited())
	if err != nil {
		log.Fatal(err)
	}
	if rr.OK {
		if extra := hc.Copies() - rr.Granted; extra > 0 {
			if err := hc.Release(ctx, extra); err != nil { // release extra copies
				log.Fatal(err)
			}
		}
		fmt.Println("processing", rr.Granted, "with", hc.Copies(), "copies")
	}
	// Output: processing 8 with 8 copies
}

// Reserve several copy-limited resources pseudo-atomically: equal copies of
// each, or none at all.
func ExampleClient_ReserveAll() {
	cs, done := exampleClients(1)
	defer done()
	c, ctx := cs[0], context.Background()

	holds, err := c.ReserveAll(ctx, []client.Resource{client.R("db", "tenant", "acme"), client.R("gpu")}, 12, 4, time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range holds {
		defer h.Close()
		fmt.Println(h.Target().Resource, h.Copies())
	}
	// Output:
	// db/tenant=acme 8
	// gpu 8
}

// Turn rejections into grants during an incident.
func ExampleClient_SetKillSwitch() {
	cs, done := exampleClients(1)
	defer done()
	c, ctx := cs[0], context.Background()

	c.SetKillSwitch(true)
	h, err := c.Reserve(ctx, client.R("gpu"), 50, 50, 0) // more than the limit
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	fmt.Println(h.OK(), h.Forced(), h.Copies())
	// Output: true true 50
}
