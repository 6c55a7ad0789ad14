package config

import "github.com/charonlimit/charon/descriptors"

func e(kv ...string) []descriptors.Entry {
	var out []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}
