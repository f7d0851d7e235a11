module github.com/confshim/confshim

go 1.26.0

require gopkg.in/yaml.v2 v2.4.0

require github.com/valyala/fastjson v1.6.10 // indirect
