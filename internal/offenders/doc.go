// Package offenders keeps, per rule, the descriptor values with the most
// rejected and the most granted hits over a recent interval, in bounded
// memory, so that "who is being limited, by which rule, right now" can be
// answered live without a Prometheus series per value.
//
// A Sketch is the Space-Saving algorithm (Metwally, Agrawal, El Abbadi,
// "Efficient Computation of Frequent and Top-k Elements in Data Streams",
// 2005) over K fixed slots with their text stored inline: an Add allocates
// nothing, whatever the stream. Each reported count c with error e brackets
// the true count t as c-e <= t <= c, e is at most N/K (N the weight the
// sketch has seen), and every value with more than N/K is reported.
//
// A Tracker holds, per rule, two epochs of a rejected and a granted sketch
// and a ring of decision counts for a chart. The epochs rotate every Epoch,
// so a read covers between one and two epochs; merging them keeps the same
// bracket and the bound N/K over the whole interval. Time is a parameter:
// the caller passes now, the package reads no clock.
package offenders
