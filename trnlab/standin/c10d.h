// STAND-IN `neuron` process group (trnlab.standin): a c10d Backend whose collectives run gloo's CPU algorithms on
// CPU views of the neuron tensors' host memory (no copies), so that init_process_group("neuron"),
// init_device_mesh("neuron", ...), DDP, FSDP2 and DTensor run on the stand-in device. Not NeuronLink/EFA, not
// Trainium's collectives: results are gloo's. After PyTorch's test/cpp_extensions/cpp_c10d_extension.cpp.
// Included by standin.cpp: one translation unit, so the torch headers are compiled once.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

namespace standin_c10d {
using c10d::Backend;
using c10d::Work;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<Tensors>;
constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// A CPU tensor on t's bytes, with t's geometry; it owns nothing (the Work below keeps t alive).
at::Tensor host(const at::Tensor& t) {
  c10::Storage bytes(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                     at::DataPtr(t.storage().mutable_data(), c10::Device(c10::kCPU)), nullptr, false);
  auto h = at::detail::make_tensor<c10::TensorImpl>(std::move(bytes), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    t.dtype());
  h.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return h;
}

// Every tensor of one collective must be on this rank's neuron device.
struct Checker {
  c10::DeviceIndex device;
  const char* op;
  void operator()(const at::Tensor& t) const {
    TORCH_CHECK(t.device().type() == kNeuron, "STAND-IN neuron process group, ", op, ": a tensor is on ", t.device(),
                ", not on neuron: move it to this rank's device first (tensor.to(\"neuron\"))");
    TORCH_CHECK(t.device().index() == device, "STAND-IN neuron process group, ", op, ": a tensor is on ", t.device(),
                " but this rank's device is neuron:", int(device), ": every tensor of a collective must be on it");
  }
};

Tensors hosts(const Tensors& ts, const Checker& check) {
  Tensors out;
  for (const auto& t : ts) check(t), out.push_back(host(t));
  return out;
}

TensorLists hosts(const TensorLists& lists, const Checker& check) {
  TensorLists out;
  for (const auto& ts : lists) out.push_back(hosts(ts, check));
  return out;
}

// gloo's Work, whose result and future hold the neuron tensors (not the CPU views gloo wrote through).
class NeuronWork final : public Work {
 public:
  NeuronWork(c10::intrusive_ptr<Work> inner, Tensors outputs, Tensors keep)
      : Work(-1, c10d::OpType::UNKNOWN), inner_(std::move(inner)), outputs_(std::move(outputs)) {
    c10::intrusive_ptr<c10::ivalue::Future> done;
    try {
      done = inner_->getFuture();
    } catch (const std::exception&) {  // send/recv: gloo gives them no future
    }
    if (done) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
      // The callback holds every tensor until gloo is done with their memory, even if this Work is dropped.
      done->addCallback([future = future_, outputs = outputs_, keep = std::move(keep)](c10::ivalue::Future& f) {
        if (f.hasError())
          future->setError(f.exception_ptr());
        else
          future->markCompleted(c10::IValue(outputs));
      });
    } else {
      keep_ = std::move(keep);
    }
  }
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    bool ok = inner_->wait(timeout);
    if (future_) future_->wait();
    return ok;
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    TORCH_CHECK(future_, "STAND-IN neuron process group: this operation (send/recv) has no future; call wait()");
    return future_;
  }

 private:
  c10::intrusive_ptr<Work> inner_;
  Tensors outputs_, keep_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

Tensors flat(const TensorLists& lists) {
  Tensors out;
  for (const auto& ts : lists) out.insert(out.end(), ts.begin(), ts.end());
  return out;
}

Tensors join(Tensors a, const Tensors& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// PREMUL_SUM (FSDP2 with a gradient divide factor): gloo has none, so each rank scales its input, then gloo sums.
bool premul(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::PREMUL_SUM; }

at::Tensor factor(const c10d::ReduceOp& op) {
  auto* s = static_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  return s->tensor_factor.defined() ? host(s->tensor_factor.is_cpu() ? s->tensor_factor : s->tensor_factor.cpu())
                                    : at::scalar_tensor(s->double_factor, at::kDouble);
}

template <typename Options>
Options summed(Options o) {  // o's op is PREMUL_SUM and the inputs are scaled: gloo sums them
  o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return o;
}

Tensors scaled(Tensors hosts, const c10d::ReduceOp& op, bool in_place) {
  for (auto& h : hosts) h = in_place ? h.mul_(factor(op)) : h.mul(factor(op));
  return hosts;
}

c10::intrusive_ptr<Work> wrap(c10::intrusive_ptr<Work> inner, Tensors outputs, const Tensors& inputs) {
  return c10::make_intrusive<NeuronWork>(std::move(inner), outputs, join(outputs, inputs));
}

class NeuronBackend final : public Backend {
 public:
  NeuronBackend(c10::intrusive_ptr<Backend> gloo, c10::DeviceIndex device)
      : Backend(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)), device_(device) {}

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Backend> gloo() const { return gloo_; }
  int64_t device() const { return device_; }
  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void setGroupUid(const std::string& uid) override { Backend::setGroupUid(uid), gloo_->setGroupUid(uid); }
  void eagerConnectSingleDevice(at::Device) override {}

  c10::intrusive_ptr<Work> broadcast(Tensors& ts, const c10d::BroadcastOptions& o) override {
    auto h = hosts(ts, {device_, "broadcast"});
    return wrap(gloo_->broadcast(h, o), ts, {});
  }
  c10::intrusive_ptr<Work> allreduce(Tensors& ts, const c10d::AllreduceOptions& o) override {
    auto h = hosts(ts, {device_, "all_reduce"});
    if (premul(o.reduceOp)) {
      h = scaled(h, o.reduceOp, true);
      return wrap(gloo_->allreduce(h, summed(o)), ts, {});
    }
    return wrap(gloo_->allreduce(h, o), ts, {});
  }
  c10::intrusive_ptr<Work> allreduce_coalesced(Tensors& ts, const c10d::AllreduceCoalescedOptions& o) override {
    auto h = hosts(ts, {device_, "all_reduce_coalesced"});
    return wrap(gloo_->allreduce_coalesced(h, o), ts, {});
  }
  c10::intrusive_ptr<Work> reduce(Tensors& ts, const c10d::ReduceOptions& o) override {
    auto h = hosts(ts, {device_, "reduce"});
    if (premul(o.reduceOp)) {
      h = scaled(h, o.reduceOp, true);
      return wrap(gloo_->reduce(h, summed(o)), ts, {});
    }
    return wrap(gloo_->reduce(h, o), ts, {});
  }
  c10::intrusive_ptr<Work> allgather(TensorLists& out, Tensors& in, const c10d::AllgatherOptions& o) override {
    auto ho = hosts(out, {device_, "all_gather"});
    auto hi = hosts(in, {device_, "all_gather"});
    return wrap(gloo_->allgather(ho, hi, o), flat(out), in);
  }
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    Checker check{device_, "all_gather_into_tensor"};
    check(out), check(in);
    auto ho = host(out), hi = host(in);
    return wrap(gloo_->_allgather_base(ho, hi, o), {out}, {in});
  }
  c10::intrusive_ptr<Work> allgather_coalesced(TensorLists& out, Tensors& in,
                                               const c10d::AllgatherOptions& o) override {
    auto ho = hosts(out, {device_, "all_gather_coalesced"});
    auto hi = hosts(in, {device_, "all_gather_coalesced"});
    return wrap(gloo_->allgather_coalesced(ho, hi, o), flat(out), in);
  }
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(Tensors& out, Tensors& in,
                                                           const c10d::AllgatherOptions& o) override {
    auto ho = hosts(out, {device_, "all_gather_into_tensor_coalesced"});
    auto hi = hosts(in, {device_, "all_gather_into_tensor_coalesced"});
    return wrap(gloo_->allgather_into_tensor_coalesced(ho, hi, o), out, in);
  }
  c10::intrusive_ptr<Work> gather(TensorLists& out, Tensors& in, const c10d::GatherOptions& o) override {
    auto ho = hosts(out, {device_, "gather"});
    auto hi = hosts(in, {device_, "gather"});
    return wrap(gloo_->gather(ho, hi, o), flat(out), in);
  }
  c10::intrusive_ptr<Work> scatter(Tensors& out, TensorLists& in, const c10d::ScatterOptions& o) override {
    auto ho = hosts(out, {device_, "scatter"});
    auto hi = hosts(in, {device_, "scatter"});
    return wrap(gloo_->scatter(ho, hi, o), out, flat(in));
  }
  c10::intrusive_ptr<Work> reduce_scatter(Tensors& out, TensorLists& in, const c10d::ReduceScatterOptions& o) override {
    auto ho = hosts(out, {device_, "reduce_scatter"});
    auto hi = hosts(in, {device_, "reduce_scatter"});
    if (premul(o.reduceOp)) {
      for (auto& list : hi) list = scaled(list, o.reduceOp, false);
      return wrap(gloo_->reduce_scatter(ho, hi, summed(o)), out, flat(in));
    }
    return wrap(gloo_->reduce_scatter(ho, hi, o), out, flat(in));
  }
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                const c10d::ReduceScatterOptions& o) override {
    Checker check{device_, "reduce_scatter_tensor"};
    check(out), check(in);
    auto ho = host(out), hi = host(in);
    if (premul(o.reduceOp)) {
      hi = hi.mul(factor(o.reduceOp));
      return wrap(gloo_->_reduce_scatter_base(ho, hi, summed(o)), {out}, {in});
    }
    return wrap(gloo_->_reduce_scatter_base(ho, hi, o), {out}, {in});
  }
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(Tensors& out, Tensors& in,
                                                           const c10d::ReduceScatterOptions& o) override {
    auto ho = hosts(out, {device_, "reduce_scatter_tensor_coalesced"});
    auto hi = hosts(in, {device_, "reduce_scatter_tensor_coalesced"});
    if (premul(o.reduceOp))
      return wrap(gloo_->reduce_scatter_tensor_coalesced(ho, hi = scaled(hi, o.reduceOp, false), summed(o)), out, in);
    return wrap(gloo_->reduce_scatter_tensor_coalesced(ho, hi, o), out, in);
  }
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                         std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    Checker check{device_, "all_to_all_single"};
    check(out), check(in);
    auto ho = host(out), hi = host(in);
    return wrap(gloo_->alltoall_base(ho, hi, out_splits, in_splits, o), {out}, {in});
  }
  c10::intrusive_ptr<Work> alltoall(Tensors& out, Tensors& in, const c10d::AllToAllOptions& o) override {
    auto ho = hosts(out, {device_, "all_to_all"});
    auto hi = hosts(in, {device_, "all_to_all"});
    return wrap(gloo_->alltoall(ho, hi, o), out, in);
  }
  c10::intrusive_ptr<Work> send(Tensors& ts, int dst, int tag) override {
    auto h = hosts(ts, {device_, "send"});
    return wrap(gloo_->send(h, dst, tag), {}, ts);
  }
  c10::intrusive_ptr<Work> recv(Tensors& ts, int src, int tag) override {
    auto h = hosts(ts, {device_, "recv"});
    return wrap(gloo_->recv(h, src, tag), ts, {});
  }
  c10::intrusive_ptr<Work> recvAnysource(Tensors& ts, int tag) override {
    auto h = hosts(ts, {device_, "recv"});
    return wrap(gloo_->recvAnysource(h, tag), ts, {});
  }
  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions& o) override { return wrap(gloo_->barrier(o), {}, {}); }
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all) override { gloo_->monitoredBarrier(o, wait_all); }

 private:
  c10::intrusive_ptr<Backend> gloo_;
  c10::DeviceIndex device_;
};

void register_c10d(pybind11::module& m) {
  pybind11::class_<NeuronBackend, Backend, c10::intrusive_ptr<NeuronBackend>>(m, "NeuronBackend")
      .def(pybind11::init([](c10::intrusive_ptr<Backend> gloo, int device) {
             return c10::make_intrusive<NeuronBackend>(std::move(gloo), static_cast<c10::DeviceIndex>(device));
           }),
           pybind11::arg("gloo"), pybind11::arg("device"))
      .def_property_readonly("gloo", &NeuronBackend::gloo)
      .def_property_readonly("device", &NeuronBackend::device);
}
}  // namespace standin_c10d
