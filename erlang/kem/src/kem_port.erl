%%% @doc Owner of one Python `kem_port' process.
%%%
%%% A thin gen_server: it frames each request as
%%% `{call, ReqId, Method, Args}', remembers `ReqId => caller' and answers
%%% the caller when `{reply, ReqId, Result}' comes back, so any number of
%%% processes call concurrently through one port and replies may arrive out
%%% of order. While callers queue, their calls are held and go out
%%% together: calls of one kernel, hint and input size as one group frame,
%%% the rest as one calls frame (kem_group). docs/protocol.md is the wire
%%% contract.
%%%
%%% Failure handling, in one place:
%%% - the port exits: every waiting caller gets `{error, {port_exited, S}}'
%%%   at once and the server stops, so the supervisor starts a new port;
%%% - a call outlives its timeout: the caller gets `{error, {timeout, _}}'
%%%   saying what the call was waiting for. The port itself answers calls
%%%   whose deadline (sent with each call) passes while they wait for a
%%%   kernel fetch or in its queue. When the owner's timer fires first it
%%%   asks the port where the call is (`call_state'): only when the GPU
%%%   thread is inside that very call, or the port does not answer within
%%%   `probe_timeout' ms, is the port killed (with `kill_on_timeout', the
%%%   default), since a kernel still running would stall every later call;
%%% - the node dies: the port's stdin closes and Python exits on EOF.
%%%
%%% A restarting owner takes a warm spare's open port (`kem_spare') instead
%%% of opening one; a call that finds no owner registered, or was still in
%%% the owner's mailbox when it stopped, waits briefly for the replacement
%%% (at most its own timeout and `restart_wait', 500 ms) and is sent again.
-module(kem_port).
-behaviour(gen_server).

-export([start_link/2, start_link/3, start_link/4, start_module/1, start_script/1, call/4, os_pid/1, python_executable/0]).
-export([open_port_process/2, close_port/3]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2, terminate/2, format_status/1]).
-export([maybe_kill/2]).

-define(MARGIN_MS, 2000).
%% What a timer and a receive accept (2^32 - 1 ms), margin included: a
%% caller's timeout outside this is refused, never able to crash the owner.
-define(IS_TIMEOUT(T), (T =:= infinity orelse
                        (is_integer(T) andalso T >= 1 andalso T =< 16#FFFFFFFF - ?MARGIN_MS))).
%% Answered to a call still in the mailbox of an owner that stops: it never
%% reached the port, so it is safe to send again to the replacement.
-define(RETRY, '$kem_port_retry').
-define(RESENDS, 3).
%% Held calls (queue_call/2, docs/protocol.md "Batch frames" and "Group
%% frames"): sent once the mailbox is empty, ?HOLD_CALLS are held or
%% ?HOLD_BYTES; a call frame over ?LONE_BYTES is never held. 64, not the
%% 256 a group frame may hold: at 256 callers (lavapipe machine, 2 shared
%% cores, alternating runs) a hold of 256 gained nothing: on the echo port
%% group frames of 59-60 calls on average either way (the mailbox empties
%% first), 119-165k calls/s against 115-136k; on kem 15.3k/16.3k against
%% 16.3k/22.3k with 64 (docs/benchmarks.md, "Group frames, from Erlang").
%% 64 keeps calls frames as they were (the port's batch, KEM_MAX_BATCH).
-define(HOLD_CALLS, 64).
-define(HOLD_BYTES, 1048576).
-include("kem_frames.hrl").  % ?LONE_BYTES
%% The ETF head of `{replies, Index, Blob}', matched here byte for byte
%% (kem_port/batch_frames.py writes the same; kem_group writes the heads of
%% the frames the node sends).
-define(REPLIES_HEAD, 131, 104, 3, 119, 7, "replies", 109).
-define(BINARY_EXT, 109).

-type reason() :: {atom(), term()}.
-export_type([reason/0]).

-spec start_link(atom(), pos_integer()) -> {ok, pid()} | {error, term()}.
start_link(Name, Index) ->
    start_link(Name, Index, undefined).

%% @doc ShmDir: the node's shared-memory directory (kem_shm_dir), handed in
%% by kem_sup and passed to Python as KEM_SHM_DIR; `undefined' for none.
-spec start_link(atom(), pos_integer(), string() | undefined) -> {ok, pid()} | {error, term()}.
start_link(Name, Index, ShmDir) ->
    gen_server:start_link({local, Name}, ?MODULE, {Name, Index, {module, "kem_port"}, ShmDir}, []).

%% @doc With Env on top of the settings (a port group's `KEM_ADAPTER',
%% kem_place).
-spec start_link(atom(), pos_integer(), string() | undefined, [{string(), string()}]) ->
    {ok, pid()} | {error, term()}.
start_link(Name, Index, ShmDir, Env) ->
    gen_server:start_link({local, Name}, ?MODULE, {Name, Index, {module, "kem_port"}, ShmDir, Env}, []).

%% @doc An unregistered, unsupervised owner of another Python module that
%% speaks the same protocol.
-spec start_module(string()) -> {ok, pid()} | {error, term()}.
start_module(Module) ->
    gen_server:start(?MODULE, {list_to_atom(Module), 0, {module, Module}, undefined}, []).

%% @doc The same for a Python script (the benchmark's tools/echo_port.py).
-spec start_script(string()) -> {ok, pid()} | {error, term()}.
start_script(Path) ->
    gen_server:start(?MODULE, {list_to_atom(filename:basename(Path)), 0, {script, Path}, undefined}, []).

%% @doc Send one request and wait for its reply, at most Timeout ms.
-spec call(atom() | pid(), atom(), tuple(), timeout()) ->
    {ok, term()} | {error, reason()}.
call(Server, Method, Args, Timeout)
        when is_atom(Server) orelse is_pid(Server), is_atom(Method), is_tuple(Args), ?IS_TIMEOUT(Timeout) ->
    Started = erlang:monotonic_time(millisecond),
    call_when_back({Server, Method, Args, Timeout, Started}, call_once(Server, Method, Args, Timeout), ?RESENDS);
call(_Server, _Method, _Args, _Timeout) ->
    {error, {bad_args, <<"call(Server, Method :: atom(), Args :: tuple(), Timeout :: 1..2^32-2001 | infinity)">>}}.

%% The owner is restarting: wait for a new owner under the name (each time
%% at most `restart_wait', never past the call's own deadline), then send
%% the call again; at most ?RESENDS times (a port killed again and again).
call_when_back(Call = {Server, Method, Args, Timeout, Started}, {retry, Why, Old}, Left) when Left > 0 ->
    Cap = application:get_env(kem, restart_wait, 500),
    Wait = min(Cap, time_left(Timeout, Started, Cap)),
    case Wait > 0 andalso kem_spare:await(Server, Old, Wait) of
        ok ->
            Again = call_once(Server, Method, Args, time_left(Timeout, Started, infinity)),
            call_when_back(Call, Again, Left - 1);
        _ ->
            Why
    end;
call_when_back(_Call, {retry, Why, _Old}, 0) ->
    Why;
call_when_back(_Call, Result, _Left) ->
    Result.

time_left(infinity, _Started, Default) -> Default;
time_left(Timeout, Started, _Default) -> max(0, Timeout - (erlang:monotonic_time(millisecond) - Started)).

-define(UNAVAILABLE, {error, {port_unavailable, <<"the port is restarting">>}}).

%% {retry, Error, OldOwner} when the call never reached a port and may be
%% sent again (Error is the answer if it cannot be): no owner registered,
%% ?RETRY from one that stopped, or an owner that stopped with the call
%% still unread (terminate/2 answered every call it had sent).
call_once(Server, Method, Args, Timeout) ->
    case unsendable(Args) of
        false ->
            case owner(Server) of
                undefined -> {retry, ?UNAVAILABLE, undefined};
                Pid -> call_owner(Pid, Method, Args, Timeout)
            end;
        What ->
            %% The port refuses these (etf_guard) but cannot tell which
            %% caller sent them: the caller would wait out its timeout, and
            %% the timeout restart the port. Refused here, at once.
            {error, {bad_args, <<What/binary, " is not accepted in a request">>}}
    end.

%% A pid, port, reference or fun anywhere in Args (binaries are leaves:
%% the walk costs ~1 us for a call's usual {Kernel, Input, Opts}).
unsendable(T) when is_pid(T) -> <<"a pid">>;
unsendable(T) when is_port(T) -> <<"a port">>;
unsendable(T) when is_reference(T) -> <<"a reference">>;
unsendable(T) when is_function(T) -> <<"a fun">>;
unsendable(T) when is_tuple(T) -> unsendable_in(tuple_to_list(T));
unsendable(T) when is_list(T) -> unsendable_in(T);
unsendable(T) when is_map(T) -> unsendable_in(maps:keys(T) ++ maps:values(T));
unsendable(_) -> false.

unsendable_in([H | T]) ->
    case unsendable(H) of false -> unsendable_in(T); What -> What end;
unsendable_in(_) -> false.

owner(Pid) when is_pid(Pid) -> Pid;
owner(Name) -> whereis(Name).

call_owner(Pid, Method, Args, Timeout) ->
    %% The server answers at Timeout; the extra margin only guards against a
    %% server that is itself stuck (e.g. suspended on a busy port).
    Backstop = case Timeout of infinity -> infinity; _ -> Timeout + ?MARGIN_MS end,
    try gen_server:call(Pid, {call, Method, Args, Timeout}, Backstop) of
        ?RETRY -> {retry, {error, {port_restarted, <<"the port restarted before this call was served">>}}, Pid};
        Result -> Result
    catch
        exit:{noproc, _} ->
            {retry, ?UNAVAILABLE, Pid};
        exit:{{shutdown, _} = Stop, _} ->
            {retry, {error, exit_error(Stop)}, Pid};
        exit:{timeout, _} ->
            {error, {timeout, <<"the port owner did not answer in time">>}};
        exit:{Reason, _} ->
            %% Never format Reason: it can hold a caller's request, input
            %% binary and all, and 100 callers printing 4 MB each stall.
            {error, {port_unavailable, exit_summary(Reason)}}
    end.

exit_summary(Reason) when is_atom(Reason) ->
    <<"the port owner exited: ", (atom_to_binary(Reason, utf8))/binary>>;
exit_summary({Tag, _}) when is_atom(Tag) ->
    <<"the port owner exited: ", (atom_to_binary(Tag, utf8))/binary>>;
exit_summary(_) ->
    <<"the port owner exited">>.

%% @doc The OS pid of the Python process behind a port owner.
-spec os_pid(atom() | pid()) -> integer().
os_pid(Server) ->
    gen_server:call(Server, os_pid).

%%% gen_server

init({Name, Index, Command, ShmDir}) ->
    init({Name, Index, Command, ShmDir, []});
init({Name, Index, Command = {module, "kem_port"}, ShmDir, Env}) ->
    process_flag(trap_exit, true),
    case whereis(kem_spare) of
        undefined ->
            %% The app's first start: open here, so a port that cannot
            %% start fails the start with its reason.
            open_fresh(Name, Index, Command, ShmDir, Env);
        _ ->
            %% A restart: return at once (the supervisor is free to restart
            %% another port meanwhile); calls queue in the mailbox until
            %% the port is taken from a spare or opened (handle_continue).
            restarting(Index, true),
            kem_spare:up(Name),  % callers waiting for the name may queue here now
            State = (new_state(Name, Index, undefined, undefined, 1))#{env => Env},
            {ok, State, {continue, {start_port, Index, ShmDir}}}
    end;
init({Name, Index, Command, ShmDir, Env}) ->
    process_flag(trap_exit, true),
    open_fresh(Name, Index, Command, ShmDir, Env).

handle_continue({start_port, Index, ShmDir}, State = #{name := Name, env := Env}) ->
    %% A spare carries the environment it was opened with (its group's
    %% adapter): only a port of that group may take it.
    case kem_spare:take(Name, Env) of
        {ok, #{port := Port, os_pid := OsPid, next := Next}} ->
            %% Already open, handshaken and warmed by kem_spare.
            kem_metrics:port_started(Name),
            restarting(Index, false),
            {noreply, State#{port := Port, os_pid := OsPid, next := Next}};
        none ->
            case open_fresh(Name, Index, {module, "kem_port"}, ShmDir, Env) of
                {ok, Opened} -> {noreply, Opened};
                {stop, Reason} -> {stop, Reason, State}
            end
    end.

open_fresh(Name, Index, Command, ShmDir, Env) ->
    Python = python_executable(),
    case open(Python, Command, ShmDir, Env) of
        {ok, Port} ->
            State = new_state(Name, Index, Port, os_pid_of(Port), 1),
            kem_metrics:port_started(Name),
            case handshake(State) of
                {ok, Ready} when Command =:= {module, "kem_port"} -> warm_then_up(Ready);
                Other -> Other
            end;
        {error, Reason} ->
            {stop, Reason}
    end.

%% Flag port Index (1-based, in kem_sup's group) as restarting or serving.
restarting(Index, Flag) ->
    case persistent_term:get({kem, restarting}, undefined) of
        undefined -> ok;
        Flags when is_integer(Index), Index >= 1 ->
            catch atomics:put(Flags, Index, case Flag of true -> 1; false -> 0 end),
            ok;
        _ -> ok
    end.

new_state(Name, Index, Port, OsPid, Next) ->
    #{name => Name, index => Index, port => Port, next => Next, pending => #{}, probes => #{}, os_pid => OsPid,
      out => [], out_bytes => 0,
      seen => maps:from_list([{S, true} || S <- kem_spare:shapes()]), warm_limit => kem_warm:limit()}.

%% @doc Open a Python `kem_port' process with the node's shared-memory
%% directory (for kem_spare): the port and its OS pid.
-spec open_port_process(string() | undefined, [{string(), string()}]) ->
    {ok, port(), integer() | undefined} | {error, term()}.
open_port_process(ShmDir, Env) ->
    case open(python_executable(), {module, "kem_port"}, ShmDir, Env) of
        {ok, Port} -> {ok, Port, os_pid_of(Port)};
        Error -> Error
    end.

handle_call({call, Method, Args, Timeout}, From, State)
        when is_atom(Method), is_tuple(Args), ?IS_TIMEOUT(Timeout) ->
    #{next := Id, pending := Pending} = State,
    Held = kem_group:held(Id, Method, Args, Timeout),
    TRef = case Timeout of
        infinity -> undefined;
        _ -> erlang:send_after(Timeout, self(), {call_timeout, Id})
    end,
    Shape = kem_warm:shape(Method, Args),
    Queued = State#{next := Id + 1, pending := Pending#{Id => {From, TRef, Method, Shape}}},
    settle(queue_call(Held, Queued));
handle_call(os_pid, _From, State = #{os_pid := OsPid}) ->
    {reply, OsPid, State};
handle_call(_Bad, _From, State) ->
    %% Whatever else a process sends: answered, never a crash of the owner.
    {reply, {error, {bad_args, <<"not a kem_port request">>}}, State}.

handle_cast(_Msg, State) ->
    {noreply, State}.

%% Every message may end with calls still held for a calls frame: they go
%% out once the mailbox is empty (settle/1).
handle_info(Msg, State) ->
    case info(Msg, State) of
        {noreply, NewState} -> settle({ok, NewState});
        Other -> Other
    end.

info(timeout, State) ->
    %% The mailbox emptied with calls held (settle/1): send them now.
    case flush(State) of
        {ok, Sent} -> {noreply, Sent};
        {closed, Held} -> stop_port_exited(closed, Held)
    end;
info({Port, {data, <<?REPLIES_HEAD, ISize:32, Index:ISize/binary, ?BINARY_EXT, BSize:32, Blob:BSize/binary>>}},
     State = #{port := Port}) ->
    case split_replies(Index, Blob, 0, []) of
        {ok, Replies} ->
            {noreply, lists:foldl(fun handle_reply/2, State, Replies)};
        bad ->
            stop_port_exited(corrupt_frame, State)
    end;
info({Port, {data, Frame}}, State = #{port := Port}) ->
    case decode(Frame) of
        {bad_frame, _} ->
            %% Our own port wrote something that is not a term: the stream is
            %% out of sync and no later reply can be trusted.
            stop_port_exited(corrupt_frame, State);
        {reply, Id, Result} when is_map_key(Id, map_get(probes, State)) ->
            kem_timeout:probe_answered(Id, Result, State);
        Reply ->
            {noreply, handle_reply(Reply, State)}
    end;
info({call_timeout, Id}, State = #{pending := Pending}) ->
    case maps:find(Id, Pending) of
        {ok, _} -> kem_timeout:call_timed_out(Id, State);
        error -> {noreply, State}
    end;
info({probe_timeout, ProbeId}, State) ->
    kem_timeout:probe_unanswered(ProbeId, State);
info({Port, eof}, State = #{port := Port}) ->
    port_output_closed(State);
info({'EXIT', Port, Reason}, State = #{port := Port}) ->
    stop_port_exited(Reason, State);
info(_Other, State) ->
    {noreply, State}.

%% Crash reports and sys:get_status must never print a payload: a request
%% can carry hundreds of MB, and formatting it stalls the dying process while
%% it still holds the registered name.
format_status(Status) ->
    maps:map(fun(state, S) when is_map(S) ->
                     S#{pending := maps:size(maps:get(pending, S, #{})), out := length(maps:get(out, S, []))};
                (message, {call, Method, _Args, Timeout}) -> {call, Method, '...', Timeout};
                (message, {Port, {data, Frame}}) when is_binary(Frame) -> {Port, {data, byte_size(Frame)}};
                (_, Value) -> Value
             end, Status).

%% A port exit is expected (kill, crash, restart on timeout): a {shutdown, _}
%% reason keeps OTP from writing a crash report; one warning line says why.
stop_port_exited(Status, State) ->
    kem_metrics:port_exited(maps:get(name, State), Status),
    logger:warning("kem_port ~p: port exited (~0p); restarting", [maps:get(name, State), Status]),
    {stop, {shutdown, {port_exited, Status}}, State#{port := undefined}}.

%% The port's stdout closed: the process is dying (its file descriptors
%% close early in its exit, the protocol pipe being one of the first), or
%% can no longer answer anyway. Act now, not once the process is reaped,
%% which comes after the GPU driver has torn down its context: tens of ms
%% on an H100 (docs/reliability.md, "The earliest sign of death"). The
%% process is killed (the 2 s backstop of close_port/3) and reaped by
%% erl_child_setup in the background; the port is closed, so nothing of it
%% reaches the next owner, which matches only its own port anyway.
port_output_closed(State = #{port := Port, os_pid := OsPid}) ->
    close_port(Port, OsPid, later),
    stop_port_exited(output_closed, State).

terminate(Reason, State = #{pending := Pending, index := Index, out := Held}) ->
    restarting(Index, true),
    %% Held calls (for a calls or group frame) never reached the port:
    %% sent again.
    Unsent = [Id || {Id, _Item} <- Held],
    [gen_server:reply(From, ?RETRY) || {From, _, _, _} <- maps:values(maps:with(Unsent, Pending))],
    [gen_server:reply(From, pending_answer(Reason, Method))
     || {From, _, Method, _} <- maps:values(maps:without(Unsent, Pending))],
    retry_unsent(),
    close(State, Reason),
    ok.

%% After a timeout kill, the kernel calls waiting behind the stuck one are
%% sent again to the replacement (within their own deadlines): kernels are
%% pure functions of their input, and these were stuck behind another's
%% kernel. Session methods are not (the new port has no such session), and
%% after a crash nothing is: one of the calls may be what crashed the port.
pending_answer({shutdown, call_timeout}, Method) when Method =:= execute; Method =:= execute_kernel;
                                                      Method =:= execute_kernel_with_params ->
    ?RETRY;
pending_answer(Reason, _Method) ->
    {error, exit_error(Reason)}.

%% Calls still in the mailbox never reached the port: their callers send
%% them again to the replacement (call_when_back/6).
retry_unsent() ->
    receive
        {'$gen_call', From, {call, _Method, _Args, _Timeout}} ->
            gen_server:reply(From, ?RETRY),
            retry_unsent()
    after 0 ->
        ok
    end.

%%% internals

%% Calls held (docs/protocol.md, "Batch frames", "Group frames"): while
%% more messages wait in the owner's mailbox a call is held, and the held
%% calls go out when the mailbox is empty, ?HOLD_CALLS are held or
%% ?HOLD_BYTES: calls of one kernel, hint and input size as group frames,
%% the rest as one calls frame (kem_group); a lone caller's call finds the
%% mailbox empty and goes out at once, as its own frame. A call whose frame
%% is over ?LONE_BYTES goes alone, after what is held (and, like a held
%% call, is sent again to the replacement if the port is closed). Each caller has one
%% call here at most (kem_port:call/4 waits for its reply), so the order in
%% which held frames go out cannot reorder one caller's calls.
queue_call(Call = {_Id, Frame}, State) when is_binary(Frame), byte_size(Frame) > ?LONE_BYTES ->
    case flush(State) of
        {ok, Flushed} -> send_units([{lone, [Call], Frame}], Flushed);
        Closed -> Closed
    end;
queue_call(Call = {_Id, Item}, State = #{out := Held, out_bytes := Bytes}) ->
    NewBytes = Bytes + kem_group:held_bytes(Item),
    Queued = State#{out := [Call | Held], out_bytes := NewBytes},
    case length(Held) + 1 >= ?HOLD_CALLS orelse NewBytes >= ?HOLD_BYTES of
        true -> flush(Queued);
        false -> {ok, Queued}
    end.

%% The reply of a callback: with calls held, send them now if nothing else
%% waits in the mailbox, or come back (timeout 0) once it is empty.
settle({ok, State = #{out := []}}) ->
    {noreply, State};
settle({ok, State}) ->
    case erlang:process_info(self(), message_queue_len) of
        {message_queue_len, 0} -> settle(flush(State));
        _ -> {noreply, State, 0}
    end;
settle({closed, State}) ->
    %% The port closed under us (killed); its eof may still be in the
    %% mailbox. Stop now: terminate answers every caller, and the held
    %% calls, which never reached the port, go to the next one.
    stop_port_exited(closed, State).

flush(State = #{out := []}) ->
    {ok, State};
flush(State = #{out := Held}) ->
    send_units(kem_group:frames(lists:reverse(Held)), State#{out := [], out_bytes := 0}).

%% Each frame in turn; if the port is closed, the calls of the frames not
%% sent are held again (terminate/2 has them sent to the replacement).
send_units([], State) ->
    {ok, State};
send_units(Units = [{Kind, Calls, Frame} | Rest], State = #{port := Port}) ->
    try port_command(Port, Frame) of
        true ->
            Kind =:= group andalso kem_metrics:group_sent(maps:get(name, State), length(Calls)),
            send_units(Rest, State)
    catch
        error:badarg -> {closed, State#{out := lists:append([C || {_, C, _} <- Units])}}
    end.

%% {ReqId, {ok, Result}} for each entry of a replies frame's index; bad if
%% the index and the blob disagree (then no reply of it can be trusted).
%% A result is a sub-binary of the frame (no copy); one of at most 64 bytes
%% is copied, which costs nothing and keeps the frame from being held.
split_replies(<<Id:64, Size:32, Rest/binary>>, Blob, Offset, Acc) when Offset + Size =< byte_size(Blob) ->
    Part = binary:part(Blob, Offset, Size),
    Result = case Size =< 64 of true -> binary:copy(Part); false -> Part end,
    split_replies(Rest, Blob, Offset + Size, [{reply, Id, {ok, Result}} | Acc]);
split_replies(<<>>, Blob, Offset, Acc) when Offset =:= byte_size(Blob) ->
    {ok, Acc};
split_replies(_Index, _Blob, _Offset, _Acc) ->
    bad.

handle_reply({reply, Id, Result}, State = #{pending := Pending}) ->
    case maps:take(Id, Pending) of
        {{From, TRef, _Method, Shape}, Rest} ->
            cancel(TRef),
            gen_server:reply(From, Result),
            note_shape(Result, Shape, State#{pending := Rest});
        error ->
            %% A reply after its caller timed out, or to ReqId `undefined'
            %% (a frame the port could not read): nobody is waiting for it.
            State
    end;
handle_reply(Other, State = #{name := Name}) ->
    kem_log:frame(Name, Other) orelse logger:warning("kem_port: unexpected frame ~P", [Other, 10]),
    State.

%% A kernel shape this port served well goes on the group's warm list.
note_shape({ok, _}, Shape, State = #{seen := Seen, warm_limit := Limit}) when Shape =/= none ->
    State#{seen := kem_warm:note(Shape, Seen, Limit)};
note_shape(_Result, _Shape, State) ->
    State.

%% Not `[safe]': the peer is our own port, whose replies carry a fixed set
%% of atoms (stats keys, error reasons) that this node may not know yet.
decode(Frame) ->
    try binary_to_term(Frame)
    catch error:badarg -> {bad_frame, Frame}
    end.

%% @private Called by kem_timeout once it knows the GPU is stuck in call Id.
-spec maybe_kill(map(), integer()) -> {noreply, map()} | {stop, term(), map()}.
maybe_kill(State, Id) ->
    case application:get_env(kem, kill_on_timeout, true) of
        true ->
            logger:warning("kem_port ~p: call ~p timed out; restarting the port",
                           [maps:get(name, State), Id]),
            {stop, {shutdown, call_timeout}, State};
        false ->
            {noreply, State}
    end.

exit_error({shutdown, {port_exited, Status}}) -> {port_exited, exit_detail(Status)};
exit_error({shutdown, call_timeout}) ->
    {port_restarted, <<"another call on this port timed out; the port was restarted">>};
exit_error(Reason) -> {port_exited, Reason}.

%% Callers get a sentence, as for every other reason (docs/protocol.md).
exit_detail(output_closed) -> <<"the port process died (its output closed); the port is restarting">>;
exit_detail(Status) when is_integer(Status) -> <<"the port process exited with status ", (integer_to_binary(Status))/binary>>;
exit_detail(Why) when is_atom(Why) -> <<"the port process exited: ", (atom_to_binary(Why))/binary>>;
exit_detail(_) -> <<"the port process exited">>.

cancel(undefined) -> ok;
cancel(TRef) -> erlang:cancel_timer(TRef, [{async, true}, {info, false}]).

close(State) ->
    close(State, normal).

close(#{port := undefined}, _Reason) ->
    ok;
close(#{port := Port, os_pid := OsPid}, {shutdown, call_timeout}) ->
    %% The GPU thread may be inside a runaway kernel: kill now; the
    %% driver's teardown of its context then runs without us.
    close_port(Port, OsPid, now);
close(#{port := Port, os_pid := OsPid}, _Reason) ->
    close_port(Port, OsPid, later).

%% @doc Close a port and make sure its process goes: closing stdin makes
%% Python exit at once (its reader thread sees EOF even if the GPU thread is
%% stuck in a kernel); a reaper process sends SIGKILL, at once (`now') or
%% after 2 s (`later', for a process that does not exit on EOF). Never blocks.
-spec close_port(port(), integer() | undefined, now | later) -> ok.
close_port(Port, OsPid, When) ->
    catch port_close(Port),
    reap(OsPid, When),
    ok.

reap(undefined, _When) -> ok;
reap(OsPid, When) ->
    spawn(fun() ->
        When =:= later andalso timer:sleep(2000),
        %% Only if that pid is still a kem port: after 2 s it may belong to
        %% another process.
        P = integer_to_list(OsPid),
        os:cmd("grep -qs kem_port /proc/" ++ P ++ "/cmdline && kill -9 " ++ P ++ " 2>/dev/null")
    end).

os_pid_of(Port) ->
    case erlang:port_info(Port, os_pid) of
        {os_pid, P} -> P;
        _ -> undefined
    end.

open(Python, Command, ShmDir, Env) ->
    Args = case Command of {module, Module} -> ["-m", Module]; {script, Path} -> [Path] end,
    Base = [{K, V} || {K, V} <- port_env(ShmDir), not lists:keymember(K, 1, Env)],
    %% `eof' and no `exit_status': the owner hears of a death when the pipe
    %% closes. With `exit_status' erts holds the end of file back until the
    %% process has been reaped, after the GPU driver's teardown
    %% (port_output_closed/1). erl_child_setup reaps every child either way.
    Opts = [{packet, 4}, binary, eof, use_stdio, hide,
            {args, Args}, {env, Base ++ Env}],
    try
        {ok, open_port({spawn_executable, Python}, Opts)}
    catch
        error:Reason -> {error, {python_not_startable, Python, Reason}}
    end.

%% Fail fast, as erlexec does: the port must answer a ping (Python opens the
%% GPU device before reading its first frame), then say which package and
%% protocol it is, or init fails with why. Log frames may come first
%% (kem_log); `{fatal, {Reason, Detail}}' is the port refusing to start (an
%% invalid setting): init fails with `{Reason, Detail}'.
handshake(State) ->
    Timeout = application:get_env(kem, start_timeout, 60000),
    case ask(State, ping, Timeout) of
        {ok, pong} ->
            case kem_version:check(ask(State, version, Timeout)) of
                ok -> {ok, State};
                {error, Reason} -> close(State), {stop, Reason}
            end;
        output_closed ->
            close(State),
            {stop, {port_exited_at_start, output_closed}};
        {fatal, {Reason, Detail}} ->
            close(State),
            {stop, {Reason, Detail}};
        timeout ->
            close(State),
            {stop, {port_start_timeout, Timeout}};
        Other ->
            close(State),
            {stop, {bad_handshake, Other}}
    end.

%% One request before any caller's: ReqId 0, answered in order.
ask(State = #{port := Port}, Method, Timeout) ->
    true = port_command(Port, term_to_binary({call, 0, Method, {}})),
    await_answer(State, erlang:monotonic_time(millisecond) + Timeout).

await_answer(State = #{port := Port, name := Name}, Deadline) ->
    receive
        {Port, {data, Frame}} ->
            case decode(Frame) of
                {reply, 0, Result} -> Result;
                {fatal, _} = Fatal -> Fatal;
                Other ->
                    case kem_log:frame(Name, Other) of
                        true -> await_answer(State, Deadline);
                        false -> Other
                    end
            end;
        {Port, eof} ->
            output_closed
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
        timeout
    end.

%% Warm the kernels the group served last (and the pinned ones) before
%% saying ready; a failure only costs the first calls their compile.
warm_then_up(State = #{port := Port, next := Id, name := Name}) ->
    Timeout = application:get_env(kem, start_timeout, 60000),
    true = port_command(Port, term_to_binary({call, Id, warm, {kem_spare:shapes()}})),
    case await_warm(Port, Id, Name, Timeout) of
        ok ->
            kem_spare:up(Name),
            restarting(maps:get(index, State), false),
            {ok, State#{next := Id + 1}};
        {stop, Reason} ->
            close(State),
            {stop, Reason}
    end.

%% The warm reply; the port's log frames that come before it go to logger.
await_warm(Port, Id, Name, Timeout) ->
    receive
        {Port, {data, Frame}} ->
            case decode(Frame) of
                {reply, Id, {ok, _Counts}} -> ok;
                Other ->
                    case kem_log:frame(Name, Other) of
                        true -> await_warm(Port, Id, Name, Timeout);
                        false -> logger:warning("kem_port ~p: warm failed: ~0P", [Name, Other, 8]), ok
                    end
            end;
        {Port, eof} ->
            {stop, {port_exited_at_start, output_closed}}
    after Timeout ->
        {stop, {port_start_timeout, Timeout}}
    end.

%% @doc The interpreter that runs the port (see kem_python).
-spec python_executable() -> string().
python_executable() ->
    kem_python:executable().

%% The port's settings (kem_settings), this node's shared-memory dir (handed
%% in by kem_sup), and a runtime dir for Mesa where the node has none.
port_env(ShmDir) ->
    Shm = [{"KEM_SHM_DIR", ShmDir} || is_list(ShmDir)],
    runtime_dir() ++ Shm ++ kem_settings:port_env().

%% Mesa's Vulkan loader prints "XDG_RUNTIME_DIR is invalid or not set" on
%% stderr, which is the node's console, at every device open when a service
%% runs without a login session. A private 0700 dir keeps it quiet.
runtime_dir() ->
    case os:getenv("XDG_RUNTIME_DIR") of
        false ->
            Dir = filename:join(filename:basedir(user_cache, "kem"), "runtime"),
            case filelib:ensure_path(Dir) =:= ok andalso file:change_mode(Dir, 8#700) =:= ok of
                true -> [{"XDG_RUNTIME_DIR", Dir}];
                false -> []
            end;
        _ ->
            []
    end.
