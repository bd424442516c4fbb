%%% @doc Sessions: named GPU buffers that stay on one port's device across
%%% calls, owned by the process that opened them; and chains of kernels
%%% run in one submission. docs/sessions.md is the full description.
%%%
%%% A session handle is `{kem_session, PortName, Incarnation, SessionId}',
%%% SessionId sealed (the port's id and a tag only this node can make).
%%% The owner (the process that called `open/1') is monitored by this
%%% server: when it exits, the session is closed on the port and its
%%% buffers go back to the pool at once. A port that restarted (kill,
%%% timeout, crash) or lost its device no longer knows the session: every
%%% later use answers `{error, {session_lost, Detail}}', never fresh state.
-module(kem_session).

-define(VERIFIED, {kem_session, verified}).
-define(VERIFIED_MAX, 16).
-behaviour(gen_server).

-export([open/1, close/1, call/4, chain/2,
         buffer_create/3, buffer_write/4, buffer_read/2, buffer_read/3,
         buffer_list/1, buffer_free/2]).
-export([start_link/0, init/1, handle_call/3, handle_cast/2, handle_info/2]).

-type session() :: {kem_session, atom(), integer(), pos_integer()}.
-type name() :: binary() | atom().
-type step() :: kernel_step() | copy_step() | clear_step().
%% A kernel: kem@1.0's bindings 0-2 (input, output, params) when it has
%% them; every other binding by WGSL name (docs/sessions.md, "The binding
%% rule"): a session or earlier step's buffer, renamed by `bind', a new
%% one of `outputs' bytes, or the step's own `buffers' (uniforms too).
-type kernel_step() :: #{kernel := kem:kernel_id(), params => binary(),
                         workgroups => {pos_integer(), pos_integer(), pos_integer()},
                         grid => {pos_integer(), pos_integer(), pos_integer()},
                         entry_point => binary() | atom(), bind => #{name() => name()},
                         input => name(), output => name(), output_size => non_neg_integer(),
                         constants => #{name() => number()}, buffers => #{name() => binary()},
                         outputs => #{name() => non_neg_integer()}}.
%% The GPU's own copy and clear commands, in the chain's one submission:
%% `{Src, SrcOffset, Dst, DstOffset, Size}' and `{Buffer, Offset, Size}',
%% bytes in whole 4-byte words, two different buffers for a copy.
-type copy_step() :: #{copy := {name(), non_neg_integer(), name(), non_neg_integer(), non_neg_integer()}}.
-type clear_step() :: #{clear := {name(), non_neg_integer(), non_neg_integer()}}.
-type reason() :: kem_port:reason().
-export_type([session/0, step/0, name/0]).

%%% API

%% @doc Open a session on one port, owned by the caller. Opts: `quota'
%% (bytes, at most the port's `session_quota_bytes'), `timeout'.
-spec open(map()) -> {ok, session()} | {error, reason()}.
open(Opts) when is_map(Opts) ->
    {Timeout, PortOpts} = take_timeout(Opts),
    case pick_port() of
        {ok, Port} ->
            case kem_port:call(Port, session_open, {PortOpts}, Timeout) of
                {ok, {Incarnation, Id}} ->
                    Session = {kem_session, Port, Incarnation, sealed(Port, Incarnation, Id)},
                    watch(self(), Session);
                Error ->
                    Error
            end;
        Error ->
            Error
    end;
open(_) ->
    {error, {bad_args, <<"session_open(Opts :: map())">>}}.

%% @doc Close a session now: its buffers go back to the port's pool.
-spec close(session()) -> ok | {error, reason()}.
close(Session = {kem_session, _, _, _}) ->
    Result = on_port(Session, session_close, []),
    catch gen_server:call(?MODULE, {unwatch, Session}),
    unit(Result);
close(_) ->
    bad_session().

%% @doc A buffer of `Size' zero bytes, or holding `Bytes'. Sizes are whole
%% 4-byte words; the name is a WGSL identifier.
-spec buffer_create(session(), name(), pos_integer() | binary()) -> ok | {error, reason()}.
buffer_create(Session, Name, Contents) ->
    unit(on_port(Session, buffer_create, [Name, Contents])).

-spec buffer_write(session(), name(), non_neg_integer(), binary()) -> ok | {error, reason()}.
buffer_write(Session, Name, Offset, Bytes) ->
    unit(on_port(Session, buffer_write, [Name, Offset, Bytes])).

-spec buffer_read(session(), name()) -> {ok, binary()} | {error, reason()}.
buffer_read(Session, Name) ->
    on_port(Session, buffer_read, [Name, 0, undefined]).

%% @doc Read `Length' bytes at `Offset' (both whole words).
-spec buffer_read(session(), name(), {non_neg_integer(), non_neg_integer()}) -> {ok, binary()} | {error, reason()}.
buffer_read(Session, Name, {Offset, Length}) ->
    on_port(Session, buffer_read, [Name, Offset, Length]).

%% @doc Every buffer of the session: `#{Name => Size}'.
-spec buffer_list(session()) -> {ok, #{binary() => non_neg_integer()}} | {error, reason()}.
buffer_list(Session) ->
    on_port(Session, buffer_list, []).

-spec buffer_free(session(), name()) -> ok | {error, reason()}.
buffer_free(Session, Name) ->
    unit(on_port(Session, buffer_free, [Name])).

%% @doc Run one kernel in the session. A kem@1.0-shaped kernel takes
%% `Input' and `output_size' (default `byte_size(Input)'; 0 for a call that
%% only changes state) as in `kem:execute/3' and returns its output; every
%% other binding binds the session's buffers by WGSL name, renamed by
%% `bind => #{WgslName => BufferName}', or the call's own `buffers'. A
%% kernel of any other shape binds every buffer so, takes `<<>>' as Input
%% and `grid' or `workgroups', and returns `#{Name => Bytes}' of what
%% `outputs' made and its in/out `buffers'. Opts as a chain step's, and
%% `gas_limit' (a looping kernel that passes it: `{gas_exhausted, Detail}').
-spec call(session(), kem:kernel_id(), binary(), map()) -> {ok, binary() | #{binary() => binary()}} | {error, reason()}.
call(Session, KernelId, Input, Opts) when is_binary(KernelId), is_binary(Input), is_map(Opts) ->
    {Timeout, PortOpts} = take_timeout(Opts),
    gas_checked(PortOpts, fun() -> on_port(Session, session_call, [KernelId, Input, PortOpts], Timeout) end);
call(_, _, _, _) ->
    {error, {bad_args, <<"session_call(Session, KernelId :: binary(), Input :: binary(), Opts :: map())">>}}.

%% @doc Run Steps in one submission. Opts: `session' (its buffers can be
%% named; without one every intermediate is temporary), `input' (the first
%% step's input bytes), `return' (buffer names: the result is then
%% `#{Name => Bytes}'; without it, the last step's output), `timeout',
%% `gas_limit' (the whole chain's gas budget, docs/metering.md; default
%% the node's `gas_limit').
%% A failing step: `{error, {Reason, #{step => N, detail => Text}}}'; a
%% looping step that ran out of gas: `{gas_exhausted, #{step => N, ...}}'.
-spec chain([step()], map()) -> {ok, binary() | #{binary() => binary()}} | {error, reason()}.
chain(Steps, Opts) when is_list(Steps), is_map(Opts) ->
    {Timeout, Rest} = take_timeout(Opts),
    gas_checked(Rest, fun() -> chain_on_port(Steps, Rest, Timeout) end);
chain(_, _) ->
    {error, {bad_args, <<"chain(Steps :: [map()], Opts :: map())">>}}.

chain_on_port(Steps, Rest, Timeout) ->
    case maps:take(session, Rest) of
        {Session, PortOpts} -> on_port(Session, chain, [Steps, PortOpts], Timeout);
        error ->
            case pick_port() of
                {ok, Port} -> kem_port:call(Port, chain, {undefined, Steps, Rest}, Timeout);
                Error -> Error
            end
    end.

%% A bad gas_limit is refused before the port, in kem:execute/3's words
%% (kem_args); the port checks it again (wire/session_protocol.py).
gas_checked(#{gas_limit := V}, _Run) when not (is_integer(V) andalso V > 0 andalso V < 1 bsl 63) ->
    {error, {bad_args, <<"gas_limit must be an integer 1..2^63-1 (docs/metering.md)">>}};
gas_checked(_Opts, Run) ->
    Run().

%%% the owner monitor

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

init([]) ->
    %% Once per node: a restarted server keeps the handles it gave valid.
    persistent_term:get({?MODULE, key}, undefined) =:= undefined
        andalso persistent_term:put({?MODULE, key}, crypto:strong_rand_bytes(32)),
    {ok, #{}}.

handle_call({watch, Owner, Session}, _From, Watched) ->
    Ref = erlang:monitor(process, Owner),
    {reply, ok, Watched#{Ref => Session}};
handle_call({unwatch, Session}, _From, Watched) ->
    Refs = [R || {R, S} <- maps:to_list(Watched), S =:= Session],
    [erlang:demonitor(R, [flush]) || R <- Refs],
    {reply, ok, maps:without(Refs, Watched)}.

handle_cast(_Msg, Watched) ->
    {noreply, Watched}.

handle_info({'DOWN', Ref, process, _Owner, _Why}, Watched) ->
    case maps:take(Ref, Watched) of
        {Session, Rest} ->
            %% Off this server: a busy port must not hold up other owners.
            spawn(fun() -> on_port(Session, session_close, []) end),
            {noreply, Rest};
        error ->
            {noreply, Watched}
    end;
handle_info(_Other, Watched) ->
    {noreply, Watched}.

%%% internals

watch(Owner, Session) ->
    try gen_server:call(?MODULE, {watch, Owner, Session}) of
        ok -> {ok, Session}
    catch
        exit:_ ->
            _ = on_port(Session, session_close, []),
            {error, {not_started, <<"kem_session is not running (start the kem application)">>}}
    end.

on_port(Session, Method, Args) ->
    on_port(Session, Method, Args, default_timeout()).

%% The session travels as {Incarnation, Id}; the port checks both.
on_port({kem_session, Port, Incarnation, Sealed}, Method, Args, Timeout) when is_atom(Port) ->
    case unsealed(Port, Incarnation, Sealed) of
        {ok, Id} -> lost(kem_port:call(Port, Method, list_to_tuple([{Incarnation, Id} | Args]), Timeout));
        error -> bad_session()
    end;
on_port(_, _, _, _) ->
    bad_session().

%% The port numbers its sessions 1, 2, 3... under one incarnation, so a
%% handle of bare ids let any process that opened a session of its own
%% read and write the buffers of the sessions next to it (issue 24, red
%% team 2). The handle's id is the port's id with a 64-bit tag, an HMAC of
%% (port, incarnation, id) under a key drawn when kem_session first
%% starts: a handle is only ever one this node handed out. (Code inside the
%% node that calls kem_port itself is the operator's: this guards the API.)
sealed(Port, Incarnation, Id) ->
    (Id bsl 64) bor tag(Port, Incarnation, Id).

unsealed(Port, Incarnation, Sealed) when is_integer(Sealed), Sealed > 0, is_integer(Incarnation) ->
    Id = Sealed bsr 64,
    Key = persistent_term:get({?MODULE, key}, undefined),
    Seen = case get(?VERIFIED) of #{} = Map -> Map; _ -> #{} end,
    case Key =/= undefined andalso (maps:is_key({Key, Port, Incarnation, Sealed}, Seen)
                                    orelse Sealed band (1 bsl 64 - 1) =:= tag(Port, Incarnation, Id)) of
        true -> remember({Key, Port, Incarnation, Sealed}, Seen), {ok, Id};
        false -> error
    end;
unsealed(_, _, _) ->
    error.

%% A handle this process has shown valid under this key is not checked
%% again: the HMAC was ~5 us of a session call's ~15 us of BEAM CPU on the
%% dev machine (the largest item under eprof). Kept in the caller's
%% process dictionary, at most ?VERIFIED_MAX handles; the key is part of
%% each entry, so a handle of an earlier key is checked afresh.
remember(Entry, Seen) when map_size(Seen) >= ?VERIFIED_MAX -> put(?VERIFIED, #{Entry => true});
remember(Entry, Seen) -> put(?VERIFIED, Seen#{Entry => true}).

tag(Port, Incarnation, Id) ->
    <<Tag:64, _/binary>> = crypto:mac(hmac, sha256, key(), term_to_binary({Port, Incarnation, Id})),
    Tag.

key() ->
    persistent_term:get({?MODULE, key}).

%% The port behind the session is gone or going: so is the session.
lost({error, {Why, _}}) when Why =:= port_exited; Why =:= port_unavailable; Why =:= port_restarted ->
    {error, {session_lost, <<"the port that held this session exited">>}};
lost(Result) ->
    Result.

unit({ok, ok}) -> ok;
unit(Other) -> Other.

bad_session() ->
    {error, {bad_args, <<"not a session: pass the handle session_open/1 returned">>}}.

%% Sessions spread over the ports at random; chains too (they are rare
%% and long next to calls; kem_place's load counts are left to calls).
pick_port() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined -> {error, {not_started, <<"application kem is not running">>}};
        %% A front node (kem_cluster): sessions are not forwarded.
        {{}, _} -> {error, {no_local_gpu, <<"sessions need a node with local GPUs">>}};
        {Names, _} -> {ok, element(1 + rand:uniform(tuple_size(Names)) - 1, Names)}
    end.

take_timeout(Opts) ->
    case maps:take(timeout, Opts) of
        {T, Rest} -> {T, Rest};
        error -> {default_timeout(), Opts}
    end.

default_timeout() ->
    application:get_env(kem, timeout, 30000).
