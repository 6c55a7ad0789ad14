//go:build js && wasm

// Command wasm is the simulator's engine: package tiers and the config
// loader compiled to WebAssembly. It sets the global charonSimCore, whose
// functions take and return JSON text:
//
//	load(lane, yaml)          {"error": "..."} or {"yaml": "...", "state": {...}}
//	request(lane, hits, now)  a Decision
//	state(lane, now)          a State
//	patterns()                the sample configurations
//
// lane is 0 or 1; now is milliseconds since the Unix epoch.
package main

import (
	"encoding/json"
	"syscall/js"

	"github.com/charonlimit/charon/internal/sim"
)

func main() {
	var lanes [2]*sim.Lane
	laneOf := func(v js.Value) *sim.Lane {
		i := v.Int()
		if i < 0 || i >= len(lanes) {
			return nil
		}
		return lanes[i]
	}
	out := func(v any) any {
		b, err := json.Marshal(v)
		if err != nil {
			b, _ = json.Marshal(map[string]string{"error": err.Error()})
		}
		return string(b)
	}
	noLane := map[string]string{"error": "no configuration loaded in this lane"}
	core := map[string]any{
		"load": js.FuncOf(func(_ js.Value, a []js.Value) any {
			i := a[0].Int()
			if i < 0 || i >= len(lanes) {
				return out(noLane)
			}
			l, err := sim.Load(a[1].String())
			if err != nil {
				return out(map[string]string{"error": err.Error()})
			}
			lanes[i] = l
			return out(map[string]any{"yaml": l.YAML(), "state": l.State(a[2].Float())})
		}),
		"request": js.FuncOf(func(_ js.Value, a []js.Value) any {
			l := laneOf(a[0])
			if l == nil {
				return out(noLane)
			}
			return out(l.Request(a[2].Float(), int64(a[1].Int())))
		}),
		"state": js.FuncOf(func(_ js.Value, a []js.Value) any {
			l := laneOf(a[0])
			if l == nil {
				return out(noLane)
			}
			return out(l.State(a[1].Float()))
		}),
		"patterns": js.FuncOf(func(js.Value, []js.Value) any { return out(sim.Patterns) }),
	}
	js.Global().Set("charonSimCore", js.ValueOf(core))
	if cb := js.Global().Get("charonSimReady"); cb.Type() == js.TypeFunction {
		cb.Invoke()
	}
	select {}
}
