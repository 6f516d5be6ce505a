// The engines mla-bisect (and its test programs) can make: registered with the library's engine registry
// (core/engine/engine.h) before any is made.
#pragma once

namespace mla {

// The reference always; cuda when this program is built with the CUDA engine, else a name that says why not.
void register_engines();

}  // namespace mla
