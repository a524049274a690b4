"""How the engine core takes in chapter 16's requests (a part of EngineCore): one whose output follows a grammar
waits until its grammar has compiled, in a thread, off the step's path (vLLM V1 compiles in the engine core the same
way); the children of a request with n > 1 wait for their sibling's prompt and then start on its blocks."""

import time

from msgspec.structs import replace

from minillm.engine.messages import EngineCoreOutput
from minillm.engine.parallel_sampling import fork, wait_for_fork
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.structured_output import StructuredOutputManager


class RequestAdmission:
    def admit(self, seq: Sequence) -> None:
        """Queue seq in the scheduler, or (n > 1) with the sibling whose prompt it shares."""
        if not wait_for_fork(self.requests, seq, seq.fork_of):
            self.scheduler.add(seq)

    @property
    def structured_output(self):
        """The StructuredOutputManager (chapter 16), made at the first request that needs a grammar."""
        if self.model_runner.structured_output is None:
            vocab = self.model_runner.model.config.vocab_size
            manager = StructuredOutputManager(self.path, vocab, list(self.model_runner.eos_token_ids))
            self.model_runner.structured_output = manager
        return self.model_runner.structured_output

    def admit_compiled(self) -> list[EngineCoreOutput]:
        """Queue the requests whose grammar has compiled (waiting for the first if nothing else can run); one whose
        grammar failed to compile fails."""
        if self.compiling and not (self.scheduler.waiting or self.scheduler.running or self.suspects):
            next(iter(self.compiling.values())).exception()  # waits until it is done
        outputs = []
        for seq, future in [(seq, f) for seq, f in self.compiling.items() if f.done()]:
            del self.compiling[seq]
            if future.exception() is None:
                seq.grammar = future.result()
                self.admit(seq)
            else:
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "error"
                error = f"the grammar did not compile: {future.exception()}"
                outputs.append(replace(self.output(seq, [], time.perf_counter()), error=error))
        return outputs

    def fork_children(self, seqs: list[Sequence], forked) -> list:
        """n > 1: start the children whose first tokens the step sampled from their sibling's last prompt row, on its
        blocks (parallel_sampling.fork), as many as there are seats (max_num_seqs); the others wait, to run on their
        own (the prefix cache shares the prompt's full blocks). [(child started, its first token's logprobs)]."""
        tokens = {child: (token, lp) for child, token, lp in forked}
        started = []
        for parent in [seq for seq in seqs if seq.forks and seq.forks[0] in tokens]:
            for child in parent.forks:
                if len(self.scheduler.running) >= self.config.max_num_seqs:  # no seat: it runs on its own later
                    self.scheduler.add(child)
                    continue
                fork(self.scheduler, parent, child, tokens[child][0])
                if child.grammar:
                    child.grammar.accept_tokens([tokens[child][0]])
                started.append((child, tokens[child][1]))
            parent.forks = []
        return started
