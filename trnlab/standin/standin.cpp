// STAND-IN neuron device (trnlab.standin): PyTorch's PrivateUse1 backend, tensors in host memory, every op run by
// its CPU kernel on that memory (a boxed fallback; conjugate, negative or non-strided tensors: PyTorch's CPU fallback,
// which copies). Not Trainium. After PyTorch's test backend "openreg"
// (test/cpp_extensions/open_registration_extension); autocast lists as TorchNeuron's torch_neuronx/csrc/amp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>

namespace {
using c10::DeviceIndex;
using c10::Stream;
using Stats = c10::CachingDeviceAllocator::DeviceStats;
constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
DeviceIndex g_count = 1;                // set from Python before the first tensor
DeviceIndex g_rank = -1;                // in a torchrun rank: its one device, neuron:<LOCAL_RANK>, as TorchNeuron's
thread_local DeviceIndex t_current = -1;  // per thread, as CUDA's current device; -1: not set in this thread
DeviceIndex current() { return t_current >= 0 ? t_current : std::max<DeviceIndex>(g_rank, 0); }

DeviceIndex checked(DeviceIndex d) {
  TORCH_CHECK(g_rank < 0 || d == g_rank, "STAND-IN neuron:", int(d), " is not this process's device: a torchrun "
              "rank has one NeuronCore, neuron:", int(g_rank), " (its LOCAL_RANK), as TorchNeuron gives it");
  TORCH_CHECK(d >= 0 && d < g_count, "STAND-IN neuron:", int(d), " does not exist: there are ", int(g_count),
              " (trnlab.standin.enable(cores=...))");
  return d;
}

// Host memory, counted per device: torch.accelerator.memory_allocated() reports what it holds. Each block keeps
// its CPU memory (the CPU allocator's, or a CPU kernel's output adopted by the fallback) and the device it counts on.
struct Block {
  c10::DataPtr memory;
  size_t n;
  DeviceIndex d;
};

struct StandInAllocator final : c10::DeviceAllocator {
  std::mutex mu;
  Stats stats[kMaxDevices];

  template <typename F>
  void each(DeviceIndex d, F f) {
    for (auto* s : {&stats[d].allocated_bytes[0], &stats[d].reserved_bytes[0], &stats[d].active_bytes[0]}) f(*s);
  }
  at::DataPtr hold(c10::DataPtr memory, size_t n, DeviceIndex d) {
    void* p = memory.get();
    {
      std::lock_guard<std::mutex> lock(mu);
      each(d, [n](auto& s) { s.increase(n); });
      stats[d].allocation[0].increase(1);
    }
    return {p, new Block{std::move(memory), n, d}, &release, c10::Device(kNeuron, d)};
  }
  at::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, c10::Device(kNeuron, current())};
    return hold(c10::GetCPUAllocator()->allocate(n), n, current());
  }
  static void release(void* block);
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }  // no raw_allocate(): blocks carry a context
  void copy_data(void* dst, const void* src, size_t n) const override { default_copy_data(dst, src, n); }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // it caches nothing
  void recordStream(const at::DataPtr&, Stream) override {}
  Stats getDeviceStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mu);
    return stats[checked(d)];
  }
  void resetAccumulatedStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mu);
    each(checked(d), [](auto& s) { s.reset_accumulated(); });
  }
  void resetPeakStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mu);
    each(checked(d), [](auto& s) { s.reset_peak(); });
  }
};
StandInAllocator g_alloc;

void StandInAllocator::release(void* block) {
  auto* b = static_cast<Block*>(block);
  {
    std::lock_guard<std::mutex> lock(g_alloc.mu);
    g_alloc.each(b->d, [n = b->n](auto& s) { s.decrease(n); });
    g_alloc.stats[b->d].allocation[0].decrease(1);
  }
  delete b;  // frees the CPU memory through its own deleter
}

// One synchronous stream per device: host work is done when the call returns.
struct StandInGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kNeuron, current()}; }
  void setDevice(c10::Device d) const override { t_current = checked(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current = d.index(); }
  Stream getStream(c10::Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream getDefaultStream(c10::Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return Stream(Stream::DEFAULT, d); }
  Stream getNewStream(c10::Device d, int) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const noexcept override { return s; }
  DeviceIndex deviceCount() const noexcept override { return g_count; }
  c10::DeviceCapability getDeviceCapability(c10::Device) const override { return {}; }
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

struct StandInGenerator : at::CPUGeneratorImpl {  // as openreg's: CPU's generator, on the neuron device
  explicit StandInGenerator(DeviceIndex d) {
    device_ = c10::Device(kNeuron, d);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

const at::Generator& default_generator(DeviceIndex d) {
  static std::vector<at::Generator> all = [] {
    std::vector<at::Generator> made;
    for (int i = 0; i < kMaxDevices; i++) made.push_back(at::make_generator<StandInGenerator>(i));
    return made;
  }();
  return all[checked(d < 0 ? current() : d)];
}

// Page-locked host memory for the device (tensor.pin_memory(), empty(pin_memory=True)): CPU memory the stand-in
// remembers, so that is_pinned() says true for it, as TorchNeuron's and CUDA's do. DDP's reducer asserts it
// (find_unused_parameters=True copies its used-parameter map through a pinned tensor).
struct PinnedAllocator final : at::Allocator {
  static std::mutex mu;
  static std::unordered_set<const void*> live;
  static void release(void* p) {
    {
      std::lock_guard<std::mutex> lock(mu);
      live.erase(p);
    }
    c10::free_cpu(p);
  }
  static bool holds(const void* p) {
    std::lock_guard<std::mutex> lock(mu);
    return live.count(p) > 0;
  }
  at::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> lock(mu);
      live.insert(p);
    }
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};
std::mutex PinnedAllocator::mu;
std::unordered_set<const void*> PinnedAllocator::live;
PinnedAllocator g_pinned;

struct StandInHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_count > 0; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  const at::Generator& getDefaultGenerator(DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(DeviceIndex d) const override {
    return at::make_generator<StandInGenerator>(d < 0 ? current() : d);
  }
  at::Device getDeviceFromPtr(void*) const override { return {kNeuron, current()}; }
  bool isPinnedPtr(const void* p) const override { return PinnedAllocator::holds(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
  DeviceIndex deviceCount() const override { return g_count; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {  // FSDP2 frees and refills
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "STAND-IN neuron: this storage is not resizable");
    const c10::DeviceGuard guard(storage.device());  // the new memory counts on the storage's device
    at::DataPtr fresh = g_alloc.allocate(n);
    if (const size_t kept = std::min(n, impl->nbytes())) std::memcpy(fresh.get(), impl->data(), kept);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(n);
  }
  void setCurrentDevice(DeviceIndex d) const override { t_current = checked(d); }
  DeviceIndex getCurrentDevice() const override { return current(); }
  DeviceIndex exchangeDevice(DeviceIndex d) const override {
    const DeviceIndex old = current();
    t_current = checked(d);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
};

// The kernels every backend must have (openreg's minimal set); every other op without a composite kernel (those
// run their decomposition, e.g. native_layer_norm's): the fallback below.
constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                               std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &g_alloc, kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &g_alloc, kKeys, c10::dtype_or_default(dtype));
}

// The same bytes as a CPU storage: non-owning, and resizable with CPU memory, so that an out= kernel that grows
// it writes elsewhere (the fallback then moves that memory into the neuron storage).
c10::Storage host_storage(const c10::Storage& storage) {
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      at::DataPtr(storage.mutable_data(), c10::Device(c10::kCPU)), c10::GetCPUAllocator(), true);
}

// `made` (a new tensor on some storage) given `like`'s sizes, strides and storage offset.
at::Tensor shaped(at::Tensor made, const at::Tensor& like) {
  made.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return made;
}

// t as a CPU tensor on `bytes` (t's storage as host_storage), with t's geometry.
at::Tensor host_view(const at::Tensor& t, c10::Storage bytes) {
  return shaped(at::detail::make_tensor<c10::TensorImpl>(std::move(bytes), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                         t.dtype()), t);
}

at::Tensor host_view(const at::Tensor& t) { return t.is_cpu() ? t : host_view(t, host_storage(t.storage())); }

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() > 0) {
    auto out = host_view(dst);
    at::native::copy_(out, host_view(self), non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  const c10::DeviceGuard guard(dst.device());  // new memory counts on dst's device
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, format);
}

bool plain(const at::Tensor& t) { return !t.defined() || (t.layout() == at::kStrided && !t.is_conj() && !t.is_neg()); }

// CPU memory that nothing else holds (a kernel's fresh output), moved out of its storage and counted on device d.
at::DataPtr adopt(c10::StorageImpl* storage, DeviceIndex d) {
  const size_t n = storage->nbytes();
  return g_alloc.hold(storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))), n, d);
}

// A CPU kernel's new output, on device d: its memory adopted when `cpu` is the only holder, else copied.
at::Tensor to_neuron(at::Tensor cpu, DeviceIndex d) {
  if (cpu.use_count() > 1 || cpu.storage().use_count() > 1 || !plain(cpu) || cpu.is_quantized() ||
      cpu._is_zerotensor())
    return cpu.to(c10::Device(kNeuron, d));
  const size_t n = cpu.storage().nbytes();
  c10::Storage bytes(c10::Storage::use_byte_size_t(), n, adopt(cpu.storage().unsafeGetStorageImpl(), d), &g_alloc,
                     true);
  return shaped(at::detail::make_tensor<c10::TensorImpl>(std::move(bytes), kKeys, cpu.dtype()), cpu);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {  // memory it grows counts on self's device
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& set_empty(at::Tensor& self) {  // set_(): an empty storage on self's device
  return set_storage(self, c10::Storage(c10::Storage::use_byte_size_t(), 0, at::DataPtr(nullptr, self.device()),
                                        &g_alloc, true), 0, {0}, {});
}

// bfloat16 and float16 matmuls: without AVX-512 BF16 PyTorch's CPU kernels run them 10-50x slower than float32
// (a 768x192 @ 192x512 mm: 116 ms in bfloat16, 3.5 ms in float32). The fallback runs these in float32 and rounds
// once to their dtype, as those kernels accumulate in float32 too.
std::optional<at::ScalarType> reduced_matmul(const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                                             size_t begin) {
  static const std::unordered_set<std::string> names{"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"};
  if ((schema.overload_name() != "" && schema.overload_name() != "out") || !names.count(schema.name()))
    return std::nullopt;
  std::optional<at::ScalarType> dtype;
  for (auto value = stack.begin() + begin; value != stack.end(); ++value)
    if (value->isTensor()) {
      const auto t = value->toTensor().scalar_type();
      if ((t != at::kBFloat16 && t != at::kHalf) || (dtype && *dtype != t)) return std::nullopt;  // mixed: CPU's error
      dtype = t;
    }
  return dtype;
}

// Every op without a kernel of its own: its CPU kernel, run on host views of the neuron tensors, so inputs are not
// copied and in-place and out= ops write the device's bytes; new outputs are moved to the device, views stay views.
// Conjugate, negative or non-strided tensors: PyTorch's cpu_fallback, which copies.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), begin = stack->size() - n;
  for (size_t i = begin; i < stack->size(); i++) {
    const auto& value = (*stack)[i];
    bool ok = true;
    if (value.isTensor()) ok = plain(value.toTensor());
    if (value.isTensorList())
      for (const at::Tensor& t : value.toTensorVector()) ok = ok && plain(t);
    if (value.isOptionalTensorList())
      for (const auto& t : value.toOptionalTensorVector()) ok = ok && (!t || plain(*t));
    if (!ok) return at::native::cpu_fallback(op, stack);
  }
  // One host storage per neuron storage and one host view per neuron tensor, so that the CPU kernel sees the
  // aliasing the arguments have (its overlap checks, an out= resize seen by every view of that memory).
  std::vector<std::pair<c10::Storage, c10::Storage>> storages;  // (neuron storage, its host storage)
  std::vector<std::pair<at::Tensor, at::Tensor>> held;          // (neuron tensor, its host view)
  std::vector<at::Tensor> host;                                 // the CPU tensors among the arguments
  std::optional<DeviceIndex> device;
  auto host_of = [&](const at::Tensor& t) {
    return std::find_if(storages.begin(), storages.end(), [&](auto& s) { return s.first.is_alias_of(t.storage()); });
  };
  auto view_of = [&](const at::Tensor& t) -> at::Tensor {
    if (t.defined() && t.device().type() != kNeuron) host.push_back(t);
    if (!t.defined() || t.device().type() != kNeuron) return t;
    if (!device) device = t.device().index();
    for (auto& [neuron, view] : held)
      if (neuron.is_same(t)) return view;
    auto found = host_of(t);
    if (found == storages.end()) found = storages.insert(storages.end(), {t.storage(), host_storage(t.storage())});
    held.emplace_back(t, host_view(t, found->second));
    return held.back().second;
  };
  std::vector<std::pair<size_t, c10::IValue>> lists;  // original tensor lists, to return for mutated ones
  std::vector<std::pair<at::Generator, at::Generator>> generators;  // (neuron generator, the CPU one in its place)
  for (size_t i = begin; i < stack->size(); i++) {
    auto& value = (*stack)[i];
    if (value.isTensor()) {
      value = view_of(value.toTensor());
    } else if (value.isTensorList()) {
      lists.emplace_back(i - begin, value);
      std::vector<at::Tensor> views;
      for (const at::Tensor& t : value.toTensorVector()) views.push_back(view_of(t));
      value = c10::List<at::Tensor>(views);
    } else if (value.isOptionalTensorList()) {
      lists.emplace_back(i - begin, value);
      c10::List<std::optional<at::Tensor>> views;
      for (const auto& t : value.toOptionalTensorVector()) views.push_back(t ? std::optional(view_of(*t)) : t);
      value = std::move(views);
    } else if (value.isGenerator() && value.toGenerator().device().type() == kNeuron) {
      // The CPU kernel takes only CPU generators: one with this generator's state, handed back after the call.
      auto cpu = at::make_generator<at::CPUGeneratorImpl>();
      cpu.set_state(value.toGenerator().get_state());
      generators.emplace_back(value.toGenerator(), cpu);
      value = cpu;
    } else if (value.isDevice() && value.toDevice().type() == kNeuron) {
      device = value.toDevice().index();
      value = c10::Device(c10::kCPU);
    }
  }
  const auto reduced = reduced_matmul(schema, *stack, begin);
  std::optional<at::Tensor> out;  // mm.out and kin (the functional mm calls it here): the result is copied into it
  for (size_t i = begin; reduced && i < stack->size(); i++) {
    auto& value = (*stack)[i];
    const auto* alias = schema.arguments()[i - begin].alias_info();
    if (value.isTensor() && alias && alias->isWrite()) {
      out = value.toTensor();
      value = at::empty({0}, at::kFloat);
    } else if (value.isTensor()) {
      value = value.toTensor().to(at::kFloat);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  if (reduced) {
    at::Tensor result = stack->back().toTensor().to(*reduced);
    if (out) {
      out->resize_(result.sizes());
      out->copy_(result);
    }
    stack->back() = out ? *out : result;  // a new tensor is moved to the device below, as any kernel's output
  }
  for (auto& [neuron, cpu] : generators) neuron.set_state(cpu.get_state());
  for (auto& [neuron, bytes] : storages)  // an out= kernel grew it into new CPU memory: the neuron storage takes that
    if (bytes.data() != neuron.data()) {
      const size_t size = bytes.nbytes();
      auto* impl = neuron.unsafeGetStorageImpl();
      impl->set_data_ptr_noswap(adopt(bytes.unsafeGetStorageImpl(), impl->device().index()));
      impl->set_nbytes(size);
    }
  for (auto& [t, view] : held) {  // and each tensor the geometry its host view has now (out= resize, t_() and kin)
    if (!view.storage().is_alias_of(host_of(t)->second))  // the kernel set_() it to other memory: a copy of that
      copy_from_and_resize(view, t);
    else if (view.sizes() != t.sizes() || view.strides() != t.strides() || view.storage_offset() != t.storage_offset())
      t.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  }
  auto shares = [](const at::Tensor& a, const at::Tensor& b) {
    return a.is_same(b) || (a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage()));
  };
  auto back = [&](at::Tensor r) -> at::Tensor {
    if (!r.defined() || !r.is_cpu() || !device) return r;
    for (auto& c : host)
      if (shares(r, c)) return r;  // a CPU argument (or a view of one) stays on the CPU
    for (auto& [t, view] : held)
      if (r.is_same(view)) return t;  // in-place and out= ops return their argument
    for (auto& [t, view] : held)      // a view of an argument: the same view of the neuron tensor, in r's dtype
      if (shares(r, view))
        return shaped(at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(t.storage()),
                                                               t.key_set(), r.dtype()), r);
    return to_neuron(std::move(r), *device);
  };
  const auto& returns = schema.returns();
  const size_t first = stack->size() - returns.size();
  for (size_t i = 0; i < returns.size(); i++) {
    auto& value = (*stack)[first + i];
    const auto* alias = returns[i].alias_info();
    if (value.isTensor()) {
      value = back(std::move(value).toTensor());  // moved: the stack no longer holds it
    } else if (value.isTensorList()) {
      auto list = std::move(value).toTensorList();
      value = c10::IValue();
      for (auto& [index, original] : lists)
        if (alias && alias->isWrite() && schema.arguments()[index].alias_info() &&
            *schema.arguments()[index].alias_info() == *alias)
          value = original;  // a mutated list argument: the original neuron tensors
      if (value.isNone()) {
        std::vector<at::Tensor> out;
        for (size_t k = 0; k < list.size(); k++)
          out.push_back(back(list.use_count() == 1 ? list.extract(k) : list.get(k)));  // extract(): moved out
        value = c10::List<at::Tensor>(out);
      }
    }
  }
}

void set_device_count(int count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices, "cores must be 1 to ", kMaxDevices, ", got ", count);
  g_count = static_cast<DeviceIndex>(count);
}

// A torchrun rank: neuron:<local_rank> is its only device, and current; numbering as the node's ranks (autograd keeps
// a queue per index below the device count).
void set_rank_device(int local_rank, int local_world_size) {
  TORCH_CHECK(local_rank >= 0 && local_rank < local_world_size && local_world_size <= kMaxDevices,
              "LOCAL_RANK must be 0 to LOCAL_WORLD_SIZE - 1, at most ", kMaxDevices - 1);
  g_rank = t_current = static_cast<DeviceIndex>(local_rank);
  g_count = static_cast<DeviceIndex>(local_world_size);
}

pybind11::object py_default_generator(int d) {
  return pybind11::reinterpret_steal<pybind11::object>(THPGenerator_initDefaultGenerator(default_generator(d)));
}

// module.to("neuron") keeps a module's parameters (param.data = moved, as on CUDA) only if a dense neuron tensor and
// a dense CPU tensor are shallow-copy compatible; c10 lists PrivateUse1 in no dense backend, so without this each
// tied weight (embed_tokens and lm_head) became two Parameters. As PyTorch's OpenRegMinimal overrides it.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  constexpr auto dense = c10::DispatchKeySet(c10::DispatchKey::Dense);
  constexpr auto backends = c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
  auto host_or_neuron = [&](c10::DispatchKeySet ks) { return ks.has_any(dense) && ks.has_any(backends); };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (host_or_neuron(self.key_set()) && host_or_neuron(from.key_set()));
}

const bool hooks_registered = (at::RegisterPrivateUse1HooksInterface(new StandInHooks()), true);
}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, StandInGuard);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_alloc);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("resize_", resize);
  m.impl("view", at::native::view);  // views share storage: the fallback cannot make them
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("set_", set_empty);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("set_.source_Storage", at::native::set_);  // which calls the next one
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

namespace at::autocast {
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false, "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: use "
              "binary_cross_entropy_with_logits or BCEWithLogitsLoss (STAND-IN neuron device, as TorchNeuron)");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {  // TorchNeuron's policy: PyTorch's CUDA op lists
#define STANDIN_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define STANDIN_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define STANDIN_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define STANDIN_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(STANDIN_LOW)
  AT_FORALL_FP32(STANDIN_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(STANDIN_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(STANDIN_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN((&binary_cross_entropy_banned)));
}
}  // namespace at::autocast

#include "c10d.h"  // the `neuron` process group

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "STAND-IN neuron device: host memory and CPU kernels, not Trainium";
  standin_c10d::register_c10d(m);
  m.def("set_device_count", &set_device_count);
  m.def("set_rank_device", &set_rank_device);
  m.def("device_count", [] { return static_cast<int>(g_count); });
  m.def("default_generator", &py_default_generator);
}
