module github.com/confshim/confshim/tools/benchplot

go 1.26.0

require golang.org/x/image v0.48.0
